//! Buckets: the sizes a program with symbolic sizes is compiled for. A size is rounded up to
//! its bucket, the inputs are padded to it and the program made exact under that padding (see
//! `tpuc_hlo`'s padded lowering), so that one executable serves every size of a bucket: sizes
//! 1..N take O(log N) executables with powers of two.
use std::collections::BTreeMap;

use crate::graph::{Dim, Graph, Program};
use crate::symbolic::{self, SymExpr};

/// How sizes are rounded up to buckets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Buckets {
    /// Powers of two, the smallest `min`.
    PowersOfTwo { min: i64 },
    /// These sizes (ascending); a size above the largest is its own bucket.
    List(Vec<i64>),
}

impl Default for Buckets {
    /// Powers of two from 16: a decoding loop's cache of 9 to 72 entries takes 4 executables.
    fn default() -> Self {
        Buckets::PowersOfTwo { min: 16 }
    }
}

impl Buckets {
    /// Reads a bucket policy as the CLI and the backend's options take it: `pow2` (powers of
    /// two from 16), `pow2:MIN`, or a comma-separated list of sizes (`64,128,256`).
    pub fn parse(text: &str) -> Result<Buckets, String> {
        let text = text.trim();
        let bad = |why: &str| {
            format!("buckets {text:?}: {why} (expected pow2, pow2:MIN or a list like 64,128,256)")
        };
        if text == "pow2" {
            return Ok(Buckets::default());
        }
        if let Some(min) = text.strip_prefix("pow2:") {
            let min: i64 = min
                .trim()
                .parse()
                .map_err(|_| bad("the minimum is not an integer"))?;
            return Buckets::powers_of_two(min).map_err(|e| bad(&e));
        }
        let sizes = text
            .split(',')
            .map(|s| s.trim().parse::<i64>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| bad("not a list of integers"))?;
        Buckets::list(sizes).map_err(|e| bad(&e))
    }

    pub fn powers_of_two(min: i64) -> Result<Buckets, String> {
        if min < 1 {
            return Err(format!("the smallest bucket must be at least 1, not {min}"));
        }
        Ok(Buckets::PowersOfTwo { min })
    }

    pub fn list(sizes: Vec<i64>) -> Result<Buckets, String> {
        if sizes.is_empty() {
            return Err("no sizes".into());
        }
        if let Some(bad) = sizes.iter().find(|&&s| s < 1) {
            return Err(format!("a bucket of {bad}"));
        }
        if sizes.windows(2).any(|w| w[0] >= w[1]) {
            return Err("the sizes must ascend".into());
        }
        Ok(Buckets::List(sizes))
    }

    /// The bucket of `size`: the smallest bucket at least `size` (`size` itself above them all).
    pub fn bucket(&self, size: i64) -> i64 {
        match self {
            Buckets::PowersOfTwo { min } => {
                let mut b = *min;
                while b < size {
                    match b.checked_mul(2) {
                        Some(next) => b = next,
                        None => return size,
                    }
                }
                b
            }
            Buckets::List(sizes) => sizes.iter().copied().find(|&b| b >= size).unwrap_or(size),
        }
    }

    /// The bucket after the one `size` falls in, where the policy has one (a list ends; sizes
    /// above it are their own buckets, which nothing predicts).
    pub fn next_bucket(&self, size: i64) -> Option<i64> {
        let next = self.bucket(self.bucket(size).checked_add(1)?);
        let predicted = match self {
            Buckets::PowersOfTwo { .. } => next != self.bucket(size),
            Buckets::List(sizes) => sizes.contains(&next),
        };
        predicted.then_some(next)
    }
}

impl std::fmt::Display for Buckets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Buckets::PowersOfTwo { min } => write!(f, "pow2:{min}"),
            Buckets::List(sizes) => {
                let text: Vec<String> = sizes.iter().map(i64::to_string).collect();
                write!(f, "{}", text.join(","))
            }
        }
    }
}

/// Each symbol's bucket for its value in `values`, no larger than the largest size its range
/// allows (a program exported for sizes up to 100 is compiled for 100, not 128).
pub fn bucket_sizes(
    program: &Program,
    values: &BTreeMap<String, i64>,
    buckets: &Buckets,
) -> BTreeMap<String, i64> {
    values
        .iter()
        .map(|(name, &value)| {
            let mut bucket = buckets.bucket(value);
            let range = program.graph.symbol_ranges.get(name);
            if let Some(max) = range.and_then(|r| r.max) {
                bucket = bucket.min(max).max(value);
            }
            (name.clone(), bucket)
        })
        .collect()
}

/// Which dimensions of a symbolic program are padded when it is compiled for buckets, and the
/// true length of each: every size that mentions a symbol. Read before specialisation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Padding {
    /// The symbols, in the order the compiled module takes their true values.
    pub symbols: Vec<String>,
    /// Per tensor with a symbolic size: per dimension, its true length (None where static).
    pub tensors: BTreeMap<String, Vec<Option<SymExpr>>>,
    /// The SymInts whose value mentions a symbol.
    pub sym_ints: BTreeMap<String, SymExpr>,
    /// The largest size each symbol's range allows, where it has one.
    pub limits: BTreeMap<String, i64>,
    /// The padding of each subgraph the graph's nodes run, by name.
    pub subgraphs: BTreeMap<String, Padding>,
}

impl Padding {
    pub fn of(program: &Program) -> Result<Padding, String> {
        let g = &program.graph;
        let symbols = symbolic::symbols(program)?
            .into_iter()
            .map(|s| s.name)
            .collect();
        let limits = g
            .symbol_ranges
            .iter()
            .filter_map(|(name, range)| Some((name.clone(), range.max?)))
            .collect();
        Padding {
            symbols,
            limits,
            ..Padding::default()
        }
        .with_graph(g)
    }

    /// This padding's symbols and limits, with the padded tensors and SymInts of `g` (and of
    /// the subgraphs it runs, by name).
    fn with_graph(self, g: &Graph) -> Result<Padding, String> {
        let parse = |d: &Dim| match d {
            Dim::Static(_) => Ok(None),
            Dim::Symbolic { expr, .. } => SymExpr::parse(expr).map(Some),
        };
        let mut tensors = BTreeMap::new();
        for (name, meta) in &g.tensors {
            let dims = meta
                .sizes
                .iter()
                .map(parse)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("tensor {name}: {e}"))?;
            if dims.iter().any(Option::is_some) {
                tensors.insert(name.clone(), dims);
            }
        }
        let mut sym_ints = BTreeMap::new();
        for (name, dim) in &g.sym_ints {
            if let Some(expr) = parse(dim).map_err(|e| format!("SymInt {name}: {e}"))? {
                sym_ints.insert(name.clone(), expr);
            }
        }
        let mut subgraphs = BTreeMap::new();
        for sub in g.subgraphs() {
            let inner = self
                .nested()
                .with_graph(&sub.graph)
                .map_err(|e| format!("subgraph {}: {e}", sub.name))?;
            subgraphs.insert(sub.name.clone(), inner);
        }
        Ok(Padding {
            tensors,
            sym_ints,
            subgraphs,
            ..self
        })
    }

    /// A padding of the same symbols and limits, of no tensor yet.
    fn nested(&self) -> Padding {
        Padding {
            symbols: self.symbols.clone(),
            limits: self.limits.clone(),
            ..Padding::default()
        }
    }

    /// The padding of subgraph `name`, one its nodes run (none of its tensors padded where it
    /// has no symbolic size).
    pub fn subgraph(&self, name: &str) -> Padding {
        self.subgraphs
            .get(name)
            .cloned()
            .unwrap_or_else(|| self.nested())
    }

    /// The true lengths of tensor `name`'s dimensions, where it has padded ones.
    pub fn dims(&self, name: &str) -> Option<&[Option<SymExpr>]> {
        self.tensors.get(name).map(Vec::as_slice)
    }

    /// Whether tensor `name` has a padded dimension.
    pub fn is_padded(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn powers_of_two_from_a_minimum() {
        let b = Buckets::default();
        assert_eq!(
            [1, 16, 17, 32, 33, 100].map(|s| b.bucket(s)),
            [16, 16, 32, 32, 64, 128]
        );
        let b = Buckets::parse("pow2:4").unwrap();
        assert_eq!([1, 4, 5, 9].map(|s| b.bucket(s)), [4, 4, 8, 16]);
    }

    #[test]
    fn a_list_and_sizes_above_it() {
        let b = Buckets::parse("64, 128").unwrap();
        assert_eq!(
            [1, 64, 65, 128, 129].map(|s| b.bucket(s)),
            [64, 64, 128, 128, 129]
        );
        assert_eq!(b.to_string(), "64,128");
    }

    #[test]
    fn the_next_bucket_is_the_policy_s_own() {
        let pow2 = Buckets::default();
        assert_eq!(pow2.next_bucket(3), Some(32));
        assert_eq!(pow2.next_bucket(16), Some(32));
        assert_eq!(pow2.next_bucket(17), Some(64));
        assert_eq!(pow2.next_bucket(i64::MAX), None);
        let list = Buckets::parse("64,128").unwrap();
        assert_eq!(list.next_bucket(10), Some(128));
        assert_eq!(list.next_bucket(128), None);
        assert_eq!(list.next_bucket(500), None);
    }

    #[test]
    fn bad_policies_are_errors_naming_what() {
        for (text, why) in [
            ("pow2:0", "at least 1"),
            ("pow2:x", "not an integer"),
            ("8,4", "ascend"),
            ("8,,16", "not a list"),
            ("0,4", "a bucket of 0"),
            ("", "not a list"),
        ] {
            let e = Buckets::parse(text).unwrap_err();
            assert!(e.contains(why) && e.contains("pow2:MIN"), "{text}: {e}");
        }
    }
}
