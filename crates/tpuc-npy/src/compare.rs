//! Comparing outputs with reference values (torch eager results, read from `.npz` files).
use crate::to_f64;
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

/// Every one of `outputs` within `atol + rtol * |reference|` of its reference, as many of each;
/// the error names each output that is not.
pub fn compare_all(
    outputs: &[HostTensor],
    references: &[HostTensor],
    rtol: f64,
    atol: f64,
) -> Result<()> {
    if outputs.len() != references.len() {
        anyhow::bail!(
            "{} outputs, but {} references",
            outputs.len(),
            references.len()
        );
    }
    let mut failures = Vec::new();
    for (i, (actual, reference)) in outputs.iter().zip(references).enumerate() {
        let diff = compare(actual, reference, rtol, atol)?;
        if !diff.ok() {
            failures.push(format!("output {i} ({}): {diff}", actual.element_type()));
        }
    }
    if !failures.is_empty() {
        anyhow::bail!("{}", failures.join("\n"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tpuc_dtype::DType;

    fn f32s(values: &[f32]) -> HostTensor {
        HostTensor::from_slice(DType::F32, &[values.len() as i64], values).unwrap()
    }

    #[test]
    fn outputs_match_within_tolerance_and_nan_matches_nan() {
        let diff = compare(
            &f32s(&[1.0, f32::NAN]),
            &f32s(&[1.0 + 1e-7, f32::NAN]),
            1e-5,
            0.0,
        );
        assert!(diff.unwrap().ok());
        let far = compare(&f32s(&[1.0, 2.0]), &f32s(&[1.0, 2.1]), 1e-5, 1e-5).unwrap();
        assert_eq!((far.mismatched, far.count), (1, 2));
        let shape = compare(&f32s(&[1.0]), &f32s(&[1.0, 2.0]), 1e-5, 1e-5).unwrap();
        assert!(!shape.ok() && shape.to_string().contains("shape [1], reference [2]"));
    }

    #[test]
    fn compare_all_names_each_output_that_differs() {
        let outputs = [f32s(&[1.0]), f32s(&[5.0])];
        assert!(compare_all(&outputs, &[f32s(&[1.0]), f32s(&[5.0])], 1e-5, 1e-5).is_ok());
        let e = compare_all(&outputs, &[f32s(&[1.0]), f32s(&[6.0])], 1e-5, 1e-5).unwrap_err();
        assert!(e.to_string().starts_with("output 1 (float32)"), "{e}");
        let e = compare_all(&outputs, &[f32s(&[1.0])], 1e-5, 1e-5).unwrap_err();
        assert!(e.to_string().contains("2 outputs, but 1 references"), "{e}");
    }
}
