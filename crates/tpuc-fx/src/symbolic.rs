//! Symbolic sizes (torch.export's dynamic shapes) and specialisation: a program whose sizes are
//! expressions of symbols (`s17`, `8*s27`) becomes the static program for chosen symbol values.
//!
//! torch.export writes each expression as sympy's `srepr` (`Mul(Integer(8), Symbol('s27',
//! positive=True, integer=True))`), with the value it had for the example inputs, and the range
//! each symbol was exported for. tpuc compiles static shapes; a symbolic program is compiled
//! per set of sizes: the example sizes, sizes the user gives, or the sizes of the inputs at hand.
use std::collections::{BTreeMap, BTreeSet};

use crate::graph::{Dim, Graph, NodeOutput, Program};

/// The sizes a symbol may take (torch.export's range constraint): `min..=max`, no upper bound
/// when `max` is None.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SymbolRange {
    pub min: i64,
    pub max: Option<i64>,
}

impl SymbolRange {
    pub fn contains(&self, value: i64) -> bool {
        value >= self.min && self.max.is_none_or(|max| value <= max)
    }
}

impl std::fmt::Display for SymbolRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.max {
            Some(max) => write!(f, "[{}, {max}]", self.min),
            None => write!(f, "[{}, inf)", self.min),
        }
    }
}

/// A size expression: an integer, a symbol, or a sympy function of expressions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SymExpr {
    Int(i64),
    Symbol(String),
    Call(String, Vec<SymExpr>),
}

impl SymExpr {
    /// Parses sympy's `srepr` form, as torch.export writes it.
    pub fn parse(text: &str) -> Result<SymExpr, String> {
        let mut parser = Parser { text, pos: 0 };
        let expr = parser.expr()?;
        parser.skip_space();
        if parser.pos != text.len() {
            return Err(parser.error("unexpected text after the expression"));
        }
        Ok(expr)
    }

    /// The symbols the expression mentions.
    pub fn symbols(&self, into: &mut BTreeSet<String>) {
        match self {
            SymExpr::Int(_) => {}
            SymExpr::Symbol(name) => {
                into.insert(name.clone());
            }
            SymExpr::Call(_, args) => args.iter().for_each(|a| a.symbols(into)),
        }
    }

    /// The value for the symbols' values in `values`, in Python's integer semantics (floor
    /// division and modulo round towards negative infinity).
    pub fn eval(&self, values: &BTreeMap<String, i64>) -> Result<i64, String> {
        match self {
            SymExpr::Int(n) => Ok(*n),
            SymExpr::Symbol(name) => values
                .get(name)
                .copied()
                .ok_or_else(|| format!("no value for symbol {name}")),
            SymExpr::Call(function, args) => {
                let args = args
                    .iter()
                    .map(|a| a.eval(values))
                    .collect::<Result<Vec<_>, _>>()?;
                apply(function, &args)
            }
        }
    }
}

/// Infix, as a person writes sizes: `8*s27`, `s27 + 2`, `(s0//2)`.
impl std::fmt::Display for SymExpr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let join = |args: &[SymExpr], sep: &str| {
            args.iter()
                .map(|a| match a {
                    SymExpr::Call(name, _) if name == "Add" && sep == "*" => format!("({a})"),
                    _ => a.to_string(),
                })
                .collect::<Vec<_>>()
                .join(sep)
        };
        match self {
            SymExpr::Int(n) => write!(f, "{n}"),
            SymExpr::Symbol(name) => write!(f, "{name}"),
            SymExpr::Call(name, args) => match (name.as_str(), args.as_slice()) {
                ("Add", _) => write!(f, "{}", join(args, " + ")),
                ("Mul", _) => write!(f, "{}", join(args, "*")),
                ("FloorDiv", [a, b]) => write!(f, "({a}//{b})"),
                _ => write!(f, "{name}({})", join(args, ", ")),
            },
        }
    }
}

/// A size expression as torch.export writes it (`srepr`), shown infix; as it is when it does
/// not parse.
pub fn pretty(srepr: &str) -> String {
    SymExpr::parse(srepr).map_or_else(|_| srepr.to_string(), |e| e.to_string())
}

fn apply(function: &str, args: &[i64]) -> Result<i64, String> {
    let overflow = || format!("{function} overflows 64-bit integers");
    let two = |what: &str| match args {
        [a, b] => Ok((*a, *b)),
        _ => Err(format!("{what} takes 2 arguments, got {}", args.len())),
    };
    let nonempty = || {
        if args.is_empty() {
            Err(format!("{function} of nothing"))
        } else {
            Ok(args.iter().copied())
        }
    };
    match function {
        "Add" => args
            .iter()
            .try_fold(0i64, |acc, v| acc.checked_add(*v))
            .ok_or_else(overflow),
        "Mul" => args
            .iter()
            .try_fold(1i64, |acc, v| acc.checked_mul(*v))
            .ok_or_else(overflow),
        "FloorDiv" => {
            let (a, b) = two(function)?;
            if b == 0 {
                return Err("FloorDiv by zero".into());
            }
            let q = a.checked_div(b).ok_or_else(overflow)?;
            Ok(if a % b != 0 && (a < 0) != (b < 0) {
                q - 1
            } else {
                q
            })
        }
        "Mod" | "PythonMod" => {
            let (a, b) = two(function)?;
            if b == 0 {
                return Err(format!("{function} by zero"));
            }
            let r = a.rem_euclid(b);
            Ok(if b < 0 && r != 0 { r + b } else { r })
        }
        // Exact division: torch emits it where it has proven divisibility.
        "CleanDiv" | "IntTrueDiv" | "ExactDiv" => {
            let (a, b) = two(function)?;
            if b == 0 || a % b != 0 {
                return Err(format!("{function}({a}, {b}) is not an exact division"));
            }
            Ok(a / b)
        }
        "Pow" | "PowByNatural" => {
            let (a, b) = two(function)?;
            let exponent = u32::try_from(b).map_err(|_| format!("{function} with exponent {b}"))?;
            a.checked_pow(exponent).ok_or_else(overflow)
        }
        "Max" => Ok(nonempty()?.max().unwrap_or_default()),
        "Min" => Ok(nonempty()?.min().unwrap_or_default()),
        "Abs" => match args {
            [a] => a.checked_abs().ok_or_else(overflow),
            _ => Err(format!("Abs takes 1 argument, got {}", args.len())),
        },
        other => Err(format!(
            "tpuc cannot evaluate the sympy function {other} (it evaluates Add, Mul, FloorDiv, \
             Mod, PythonMod, CleanDiv, IntTrueDiv, Pow, Max, Min and Abs of integers)"
        )),
    }
}

struct Parser<'a> {
    text: &'a str,
    pos: usize,
}

impl Parser<'_> {
    fn error(&self, what: &str) -> String {
        format!("{what} at character {} of {:?}", self.pos, self.text)
    }

    fn skip_space(&mut self) {
        let rest = &self.text[self.pos..];
        self.pos += rest.len() - rest.trim_start().len();
    }

    fn peek(&mut self) -> Option<char> {
        self.skip_space();
        self.text[self.pos..].chars().next()
    }

    fn expect(&mut self, c: char) -> Result<(), String> {
        if self.peek() == Some(c) {
            self.pos += c.len_utf8();
            Ok(())
        } else {
            Err(self.error(&format!("expected {c:?}")))
        }
    }

    /// A run of characters satisfying `keep`.
    fn take(&mut self, keep: impl Fn(char) -> bool) -> &str {
        self.skip_space();
        let start = self.pos;
        let len = self.text[start..]
            .find(|c: char| !keep(c))
            .unwrap_or(self.text.len() - start);
        self.pos += len;
        &self.text[start..start + len]
    }

    fn integer(&mut self) -> Result<i64, String> {
        let negative = self.peek() == Some('-');
        if negative {
            self.pos += 1;
        }
        let digits = self.take(|c| c.is_ascii_digit());
        let value: i64 = digits
            .parse()
            .map_err(|_| self.error("expected an integer"))?;
        Ok(if negative { -value } else { value })
    }

    fn expr(&mut self) -> Result<SymExpr, String> {
        if matches!(self.peek(), Some(c) if c == '-' || c.is_ascii_digit()) {
            return self.integer().map(SymExpr::Int);
        }
        let name = self
            .take(|c| c.is_ascii_alphanumeric() || c == '_')
            .to_string();
        if name.is_empty() {
            return Err(self.error("expected an expression"));
        }
        self.expect('(')?;
        let expr = match name.as_str() {
            "Integer" => SymExpr::Int(self.integer()?),
            "Symbol" => {
                self.expect('\'')?;
                let symbol = self.take(|c| c != '\'').to_string();
                self.expect('\'')?;
                // Assumptions (positive=True, integer=True) follow; they change no value.
                while self.peek() == Some(',') {
                    self.pos += 1;
                    self.take(|c| c != ',' && c != ')');
                }
                SymExpr::Symbol(symbol)
            }
            _ => {
                let mut args = Vec::new();
                if self.peek() != Some(')') {
                    args.push(self.expr()?);
                    while self.peek() == Some(',') {
                        self.pos += 1;
                        args.push(self.expr()?);
                    }
                }
                SymExpr::Call(name, args)
            }
        };
        self.expect(')')?;
        Ok(expr)
    }
}

/// A symbol of a program: its range and the value it had for the example inputs.
#[derive(Clone, Debug, PartialEq)]
pub struct Symbol {
    pub name: String,
    pub range: Option<SymbolRange>,
    pub example: Option<i64>,
}

impl std::fmt::Display for Symbol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.name)?;
        if let Some(range) = self.range {
            write!(f, " in {range}")?;
        }
        if let Some(example) = self.example {
            write!(f, ", exported with {example}")?;
        }
        Ok(())
    }
}

/// Every symbolic dimension of the program: tensor sizes and strides, SymInt values.
fn symbolic_dims(program: &Program) -> impl Iterator<Item = (&str, Option<i64>)> {
    let g = &program.graph;
    let metas = g
        .tensors
        .values()
        .flat_map(|m| m.sizes.iter().chain(&m.strides));
    metas.chain(g.sym_ints.values()).filter_map(|d| match d {
        Dim::Symbolic { expr, hint } => Some((expr.as_str(), *hint)),
        Dim::Static(_) => None,
    })
}

/// Whether any size of the program is symbolic.
pub fn is_symbolic(program: &Program) -> bool {
    symbolic_dims(program).next().is_some()
}

/// The symbols the program's sizes mention, by name, with their ranges and example values (read
/// off the example values of sizes that are linear in one symbol). torch.export also records
/// ranges of derived sizes (`2*s44`); those follow from their symbols' and are not symbols.
pub fn symbols(program: &Program) -> Result<Vec<Symbol>, String> {
    let mut names = BTreeSet::new();
    let mut examples = BTreeMap::new();
    for (text, hint) in symbolic_dims(program) {
        let expr = SymExpr::parse(text)?;
        if let Some((name, example)) = hint.and_then(|h| solve_for_symbol(&expr, h)) {
            examples.insert(name, example);
        }
        expr.symbols(&mut names);
    }
    Ok(names
        .into_iter()
        .map(|name| Symbol {
            range: program.graph.symbol_ranges.get(&name).copied(),
            example: examples.get(&name).copied(),
            name,
        })
        .collect())
}

/// A symbol whose value tensor values decide when the program runs (torch's unbacked
/// symbols: `.item()`, `nonzero`, a size read from data), with the node that first produces it.
#[derive(Clone, Debug, PartialEq)]
pub struct ValueDecided {
    pub symbol: String,
    pub node: String,
    pub target: String,
    pub source: Option<crate::graph::SourceLoc>,
}

/// The program's symbols that no input's size mentions: tensor values decide them, so no size
/// given before the run can stand for them (fixing one would compute a wrong result for every
/// other value). Empty for a program whose symbols all come from its inputs' sizes.
pub fn value_decided(program: &Program) -> Result<Vec<ValueDecided>, String> {
    let g = &program.graph;
    let mentioned = |dims: &mut dyn Iterator<Item = &Dim>| -> Result<BTreeSet<String>, String> {
        let mut names = BTreeSet::new();
        for d in dims {
            if let Dim::Symbolic { expr, .. } = d {
                SymExpr::parse(expr)?.symbols(&mut names);
            }
        }
        Ok(names)
    };
    let from_inputs = mentioned(
        &mut g
            .inputs
            .iter()
            .filter_map(|i| g.tensor(&i.name))
            .flat_map(|m| m.sizes.iter()),
    )?;
    let mut found: Vec<ValueDecided> = Vec::new();
    for node in &g.nodes {
        let mut dims: Vec<&Dim> = Vec::new();
        for output in &node.outputs {
            if let NodeOutput::SymInt(name) = output {
                dims.extend(g.sym_ints.get(name));
            }
        }
        for tensor in node.defined_tensors() {
            dims.extend(g.tensor(tensor).into_iter().flat_map(|m| m.sizes.iter()));
        }
        for symbol in mentioned(&mut dims.into_iter())? {
            if !from_inputs.contains(&symbol) && !found.iter().any(|f| f.symbol == symbol) {
                found.push(ValueDecided {
                    symbol,
                    node: node.name.clone(),
                    target: node.target.clone(),
                    source: node.source(),
                });
            }
        }
    }
    Ok(found)
}

/// Why a program with [`value_decided`] symbols is refused, naming each and where it comes from.
pub fn describe_value_decided(list: &[ValueDecided]) -> String {
    let each: Vec<String> = list
        .iter()
        .map(|v| {
            let at = v
                .source
                .as_ref()
                .map(|s| format!(" at {s}"))
                .unwrap_or_default();
            format!("{} (node {}, {}{at})", v.symbol, v.node, v.target)
        })
        .collect();
    format!(
        "not supported: tensor values decide the size{} {} when the program runs; tpuc compiles \
         static sizes, and fixing {} would compute wrong results for other values: export the \
         program without reading tensor values as sizes or numbers (`.item()`, `nonzero`, \
         `repeat_interleave` without `output_size`), or run it with torch.compile(backend=\"tpuc\"), \
         which runs such ops in eager torch",
        if each.len() == 1 { "" } else { "s" },
        each.join(", "),
        if each.len() == 1 { "it" } else { "them" },
    )
}

/// Describes the program's symbols on one line: `s17 in [2, 64], exported with 3; s27 ...`.
pub fn describe_symbols(program: &Program) -> String {
    match symbols(program) {
        Ok(list) => list
            .iter()
            .map(Symbol::to_string)
            .collect::<Vec<_>>()
            .join("; "),
        Err(e) => format!("(unreadable: {e})"),
    }
}

/// Values for the program's symbols: those in `given`, the others their example values. Every
/// value is checked against the symbol's range; a name that is not a symbol is an error.
pub fn resolve_sizes(
    program: &Program,
    given: &BTreeMap<String, i64>,
) -> Result<BTreeMap<String, i64>, String> {
    let decided = value_decided(program)?;
    if !decided.is_empty() {
        return Err(describe_value_decided(&decided));
    }
    let symbols = symbols(program)?;
    if let Some(unknown) = given
        .keys()
        .find(|k| !symbols.iter().any(|s| &s.name == *k))
    {
        return Err(if symbols.is_empty() {
            format!("the program has no symbolic sizes, so no size {unknown} to set")
        } else {
            format!(
                "the program has no symbolic size {unknown}; its symbols: {}",
                describe_symbols(program)
            )
        });
    }
    let mut values = BTreeMap::new();
    for symbol in &symbols {
        let value = match (given.get(&symbol.name), symbol.example) {
            (Some(&v), _) | (None, Some(v)) => v,
            (None, None) => {
                return Err(format!(
                    "symbolic size {} has no example value; give it one",
                    symbol.name
                ))
            }
        };
        if value < 0 {
            return Err(format!("size {}={value} is negative", symbol.name));
        }
        if let Some(range) = symbol.range.filter(|r| !r.contains(value)) {
            return Err(format!(
                "size {}={value} is outside the range {range} the program was exported for",
                symbol.name
            ));
        }
        values.insert(symbol.name.clone(), value);
    }
    Ok(values)
}

/// Symbol values read off concrete input sizes: a dimension of a user input that is a symbol,
/// or a linear expression of one (`2*s44`, `s0 + 1`), gives that symbol's value; two inputs
/// giving one symbol different values is an error. `inputs[i]` is the i-th user input's sizes,
/// in signature order; inputs of the wrong rank, and sizes no value of the symbol gives, are
/// left to the caller's signature check.
pub fn sizes_from_inputs(
    program: &Program,
    inputs: &[Vec<i64>],
) -> Result<BTreeMap<String, i64>, String> {
    let g = &program.graph;
    let mut declared = Vec::new();
    for input in g
        .inputs
        .iter()
        .filter(|i| i.kind == crate::graph::InputKind::UserInput)
    {
        let dims = match g.tensor(&input.name) {
            Some(meta) => meta
                .sizes
                .iter()
                .map(|d| match d {
                    Dim::Static(_) => Ok(None),
                    Dim::Symbolic { expr, .. } => SymExpr::parse(expr).map(Some),
                })
                .collect::<Result<Vec<_>, _>>()?,
            None => Vec::new(),
        };
        declared.push((input.name.as_str(), dims));
    }
    symbol_values(&declared, inputs)
}

/// Symbol values read off concrete sizes, as [`sizes_from_inputs`] does: `declared[i]` is the
/// i-th input's name and its sizes (an expression where symbolic), `inputs[i]` its sizes.
pub fn symbol_values<S: AsRef<str>>(
    declared: &[(S, Vec<Option<SymExpr>>)],
    inputs: &[Vec<i64>],
) -> Result<BTreeMap<String, i64>, String> {
    let mut values: BTreeMap<String, (i64, String)> = BTreeMap::new();
    for (index, ((name, dims), sizes)) in declared.iter().zip(inputs).enumerate() {
        if dims.len() != sizes.len() {
            continue;
        }
        for (axis, (dim, &size)) in dims.iter().zip(sizes).enumerate() {
            let Some(expr) = dim else {
                continue;
            };
            let Some((symbol, size)) = solve_for_symbol(expr, size) else {
                continue;
            };
            let here = format!("input {index} ({}) dimension {axis}", name.as_ref());
            match values.get(&symbol) {
                Some((seen, there)) if *seen != size => {
                    return Err(format!(
                        "{here} is {size} but {there} is {seen}; both are size {symbol}"
                    ))
                }
                Some(_) => {}
                None => {
                    values.insert(symbol, (size, here));
                }
            }
        }
    }
    Ok(values.into_iter().map(|(k, (v, _))| (k, v)).collect())
}

/// The value of the one symbol of `expr` for which `expr` is `size`, when `expr` is linear in
/// it (`a*s + b`, checked by evaluating back).
fn solve_for_symbol(expr: &SymExpr, size: i64) -> Option<(String, i64)> {
    let mut names = BTreeSet::new();
    expr.symbols(&mut names);
    let name = names.pop_first().filter(|_| names.is_empty())?;
    let at = |v: i64| expr.eval(&BTreeMap::from([(name.clone(), v)])).ok();
    let (b, a) = (at(0)?, at(1)?.checked_sub(at(0)?)?);
    let offset = size.checked_sub(b)?;
    if a == 0 || offset % a != 0 {
        return None;
    }
    let value = offset / a;
    (at(value)? == size).then_some((name, value))
}

/// The program with every symbolic size replaced by its value for `values` (every symbol must
/// have one: see [`resolve_sizes`]).
pub fn specialize(mut program: Program, values: &BTreeMap<String, i64>) -> Result<Program, String> {
    specialize_graph(&mut program.graph, values)?;
    Ok(program)
}

/// `graph`'s sizes, and those of every subgraph it runs, for `values`.
fn specialize_graph(graph: &mut Graph, values: &BTreeMap<String, i64>) -> Result<(), String> {
    let dim = |d: &Dim| -> Result<Dim, String> {
        match d {
            Dim::Static(_) => Ok(d.clone()),
            Dim::Symbolic { expr, .. } => SymExpr::parse(expr)?
                .eval(values)
                .map(Dim::Static)
                .map_err(|e| format!("size {expr}: {e}")),
        }
    };
    let dims = |list: &[Dim]| list.iter().map(dim).collect::<Result<Vec<_>, _>>();
    for (name, meta) in &mut graph.tensors {
        let sizes = dims(&meta.sizes).map_err(|e| format!("tensor {name}: {e}"))?;
        if let Some(bad) = sizes.iter().filter_map(Dim::as_static).find(|&n| n < 0) {
            return Err(format!("tensor {name}: a size is {bad} for these sizes"));
        }
        meta.strides = dims(&meta.strides).map_err(|e| format!("tensor {name}: {e}"))?;
        meta.sizes = sizes;
    }
    for (name, value) in &mut graph.sym_ints {
        *value = dim(value).map_err(|e| format!("SymInt {name}: {e}"))?;
    }
    for sub in graph.subgraphs_mut() {
        specialize_graph(&mut sub.graph, values)
            .map_err(|e| format!("subgraph {}: {e}", sub.name))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sym(name: &str) -> String {
        format!("Symbol('{name}', positive=True, integer=True)")
    }

    fn eval(text: &str, values: &[(&str, i64)]) -> Result<i64, String> {
        let values = values.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        SymExpr::parse(text)?.eval(&values)
    }

    #[test]
    fn parses_and_evaluates_torch_export_expressions() {
        let s = sym("s27");
        assert_eq!(eval(&s, &[("s27", 5)]), Ok(5));
        assert_eq!(
            eval(&format!("Mul(Integer(8), {s})"), &[("s27", 5)]),
            Ok(40)
        );
        assert_eq!(
            eval(
                &format!("Add(Mul(Integer(16), {s}), Integer(32))"),
                &[("s27", 5)]
            ),
            Ok(112)
        );
        assert_eq!(
            eval(
                &format!("Mul({}, {s})", sym("s17")),
                &[("s17", 3), ("s27", 5)]
            ),
            Ok(15)
        );
        assert_eq!(
            eval(&format!("FloorDiv({s}, Integer(2))"), &[("s27", 7)]),
            Ok(3)
        );
        assert_eq!(
            eval(&format!("Add({s}, Integer(-1))"), &[("s27", 7)]),
            Ok(6)
        );
        assert_eq!(eval(&format!("Max(Integer(1), {s})"), &[("s27", 0)]), Ok(1));
    }

    #[test]
    fn shown_infix() {
        let s = sym("s27");
        assert_eq!(pretty(&s), "s27");
        assert_eq!(
            pretty(&format!("Add(Mul(Integer(16), {s}), Integer(32))")),
            "16*s27 + 32"
        );
        assert_eq!(
            pretty(&format!("Mul(Integer(2), Add({s}, Integer(1)))")),
            "2*(s27 + 1)"
        );
        assert_eq!(pretty(&format!("FloorDiv({s}, Integer(2))")), "(s27//2)");
        assert_eq!(pretty("not srepr"), "not srepr");
    }

    #[test]
    fn python_integer_semantics() {
        assert_eq!(apply("FloorDiv", &[-7, 2]), Ok(-4));
        assert_eq!(apply("FloorDiv", &[7, -2]), Ok(-4));
        assert_eq!(apply("FloorDiv", &[-7, -2]), Ok(3));
        assert_eq!(apply("Mod", &[-7, 3]), Ok(2));
        assert_eq!(apply("Mod", &[7, -3]), Ok(-2));
        assert_eq!(apply("Pow", &[3, 2]), Ok(9));
    }

    #[test]
    fn bad_expressions_are_errors_naming_what() {
        assert!(SymExpr::parse("Mul(Integer(8), ")
            .unwrap_err()
            .contains("expected"));
        assert!(SymExpr::parse("Integer(8) junk")
            .unwrap_err()
            .contains("after"));
        assert!(SymExpr::parse("")
            .unwrap_err()
            .contains("expected an expression"));
        let err = eval("Sqrt(Integer(4))", &[]).unwrap_err();
        assert!(err.contains("Sqrt"), "{err}");
        assert!(eval(&sym("s1"), &[])
            .unwrap_err()
            .contains("no value for symbol s1"));
        assert!(apply("FloorDiv", &[1, 0]).unwrap_err().contains("zero"));
        assert!(apply("Mul", &[i64::MAX, 2])
            .unwrap_err()
            .contains("overflows"));
        assert!(apply("CleanDiv", &[7, 2]).unwrap_err().contains("exact"));
    }

    #[test]
    fn linear_sizes_solved_for_their_symbol() {
        let s = sym("s44");
        let double = SymExpr::parse(&format!("Mul(Integer(2), {s})")).unwrap();
        assert_eq!(solve_for_symbol(&double, 14), Some(("s44".into(), 7)));
        assert_eq!(solve_for_symbol(&double, 13), None);
        let shifted = SymExpr::parse(&format!("Add({s}, Integer(3))")).unwrap();
        assert_eq!(solve_for_symbol(&shifted, 10), Some(("s44".into(), 7)));
        let square = SymExpr::parse(&format!("Pow({s}, Integer(2))")).unwrap();
        assert_eq!(solve_for_symbol(&square, 9), None);
        let two = SymExpr::parse(&format!("Mul({s}, {})", sym("s1"))).unwrap();
        assert_eq!(solve_for_symbol(&two, 6), None);
    }

    #[test]
    fn ranges() {
        let bounded = SymbolRange {
            min: 2,
            max: Some(64),
        };
        assert!(bounded.contains(2) && bounded.contains(64));
        assert!(!bounded.contains(1) && !bounded.contains(65));
        let open = SymbolRange { min: 0, max: None };
        assert!(open.contains(1 << 40));
        assert_eq!(bounded.to_string(), "[2, 64]");
        assert_eq!(open.to_string(), "[0, inf)");
    }
}
