//! Programs with symbolic sizes compiled per bucket (`tpuc_fx::buckets`): which bucket a call's
//! sizes fall in, and what a call of a bucket's executable takes and gives back — its inputs
//! padded to the bucket's shapes, the true value of each symbol, results sliced to their true
//! shapes.

use std::collections::BTreeMap;

use tpuc_fx::buckets::{Buckets, Padding};
use tpuc_fx::symbolic::{self, SymExpr};
use tpuc_hlo::Signature;

use crate::error::{Error, Result};

/// How a program compiled for a bucket is called.
#[derive(Clone, Debug, PartialEq)]
pub struct Padded {
    pub policy: Buckets,
    /// The symbols (in the order the module takes their true values) and their buckets.
    pub buckets: Vec<(String, i64)>,
    /// The largest size each symbol's range allows, where it has one.
    pub limits: BTreeMap<String, i64>,
    /// Per user input (in signature order): its name and per dimension its true length where
    /// it is padded.
    pub inputs: Vec<(String, Vec<Option<SymExpr>>)>,
    /// Per result: per dimension its true length where it is padded.
    pub results: Vec<Vec<Option<SymExpr>>>,
}

/// What one call of a padded program needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallSizes {
    /// The true value of each symbol, in the order the module takes them.
    pub values: Vec<i64>,
    /// The true shape of each result (its first elements along each padded dimension).
    pub results: Vec<Vec<i64>>,
}

impl Padded {
    /// How a program whose padded dimensions are `padding` is called, compiled for `buckets`.
    pub(crate) fn new(
        policy: &Buckets,
        padding: &Padding,
        buckets: &BTreeMap<String, i64>,
        signature: &Signature,
    ) -> Padded {
        let dims = |name: &str| padding.dims(name).map(<[_]>::to_vec);
        Padded {
            policy: policy.clone(),
            buckets: padding
                .symbols
                .iter()
                .map(|s| (s.clone(), buckets.get(s).copied().unwrap_or_default()))
                .collect(),
            limits: padding.limits.clone(),
            inputs: signature
                .args
                .iter()
                .filter_map(|role| match role {
                    tpuc_hlo::ArgRole::UserInput(name) => {
                        Some((name.clone(), dims(name).unwrap_or_default()))
                    }
                    _ => None,
                })
                .collect(),
            results: signature
                .results
                .iter()
                .map(|r| dims(&r.name).unwrap_or_default())
                .collect(),
        }
    }

    /// The buckets as `s0=16, s1=32`.
    pub fn describe(&self) -> String {
        let parts: Vec<String> = self
            .buckets
            .iter()
            .map(|(s, b)| format!("{s}={b}"))
            .collect();
        parts.join(", ")
    }

    /// The sizes of a call on user inputs of shapes `inputs` (true sizes, before padding), whose
    /// results have the bucket shapes `result_shapes`. Sizes of another bucket are an error.
    pub fn call_sizes(&self, inputs: &[Vec<i64>], result_shapes: &[Vec<i64>]) -> Result<CallSizes> {
        let found = symbolic::symbol_values(&self.inputs, inputs).map_err(Error::Invalid)?;
        let mut values = Vec::with_capacity(self.buckets.len());
        for (symbol, bucket) in &self.buckets {
            let value = *found.get(symbol).ok_or_else(|| {
                Error::Invalid(format!("no input's shape gives the size {symbol}"))
            })?;
            if value > *bucket {
                return Err(Error::Invalid(format!(
                    "size {symbol}={value} is not in the bucket {bucket} this executable was \
                     compiled for"
                )));
            }
            values.push(value);
        }
        let results = self
            .results
            .iter()
            .zip(result_shapes)
            .map(|(dims, shape)| {
                shape
                    .iter()
                    .enumerate()
                    .map(|(d, &size)| match dims.get(d).cloned().flatten() {
                        Some(expr) => expr.eval(&found).map_err(Error::Invalid),
                        None => Ok(size),
                    })
                    .collect::<Result<Vec<i64>>>()
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(CallSizes { values, results })
    }
}
