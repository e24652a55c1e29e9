//! The symbolic-size expression parser (sympy's srepr form) and its evaluation.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::collections::{BTreeMap, BTreeSet};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(expr) = tpuc_fx::symbolic::SymExpr::parse(text) else { return };
    let mut symbols = BTreeSet::new();
    expr.symbols(&mut symbols);
    // Every symbol at a few values, extremes included: arithmetic errors, never overflow panics.
    for value in [0, 1, 7, -3, i64::MAX, i64::MIN] {
        let values: BTreeMap<String, i64> = symbols.iter().map(|s| (s.clone(), value)).collect();
        let _ = expr.eval(&values);
    }
});
