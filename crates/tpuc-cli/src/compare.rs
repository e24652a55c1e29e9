//! Comparing outputs with reference values (torch eager results).
use crate::npy::to_f64;
use anyhow::Result;
use std::fmt;
use tpuc_pjrt::HostTensor;

/// How far one output is from its reference.
#[derive(Clone, Debug, PartialEq)]
pub struct Difference {
    pub max_abs: f64,
    /// Largest |a - b| / |b| over elements whose reference is not zero.
    pub max_rel: f64,
    /// Elements outside `atol + rtol * |reference|` (NaN matches NaN, infinities must be equal).
    pub mismatched: usize,
    pub count: usize,
    /// Shapes differ (then nothing else was compared).
    pub shape_mismatch: Option<(Vec<i64>, Vec<i64>)>,
}

impl Difference {
    pub fn ok(&self) -> bool {
        self.shape_mismatch.is_none() && self.mismatched == 0
    }
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some((got, want)) = &self.shape_mismatch {
            return write!(f, "shape {got:?}, reference {want:?}");
        }
        write!(
            f,
            "max abs diff {:.3e}, max rel diff {:.3e}, {} of {} elements outside tolerance",
            self.max_abs, self.max_rel, self.mismatched, self.count
        )
    }
}

/// Compares `actual` with `reference` elementwise (as numpy's `isclose`; complex numbers part by
/// part). Integer and bool tensors are compared exactly whatever the tolerances.
pub fn compare(
    actual: &HostTensor,
    reference: &HostTensor,
    rtol: f64,
    atol: f64,
) -> Result<Difference> {
    if actual.dims() != reference.dims() {
        return Ok(Difference {
            max_abs: f64::NAN,
            max_rel: f64::NAN,
            mismatched: 0,
            count: 0,
            shape_mismatch: Some((actual.dims().to_vec(), reference.dims().to_vec())),
        });
    }
    let inexact = |t: &HostTensor| t.element_type().is_float() || t.element_type().is_complex();
    let exact = !inexact(actual) || !inexact(reference);
    let (rtol, atol) = if exact { (0.0, 0.0) } else { (rtol, atol) };
    let a = to_f64(actual)?;
    let b = to_f64(reference)?;
    let mut diff = Difference {
        max_abs: 0.0,
        max_rel: 0.0,
        mismatched: 0,
        count: a.len(),
        shape_mismatch: None,
    };
    for (&x, &y) in a.iter().zip(&b) {
        let close = if x.is_nan() || y.is_nan() {
            x.is_nan() && y.is_nan()
        } else if x.is_infinite() || y.is_infinite() {
            x == y
        } else {
            let d = (x - y).abs();
            diff.max_abs = diff.max_abs.max(d);
            if y != 0.0 {
                diff.max_rel = diff.max_rel.max(d / y.abs());
            }
            d <= atol + rtol * y.abs()
        };
        if !close {
            diff.mismatched += 1;
        }
    }
    Ok(diff)
}
