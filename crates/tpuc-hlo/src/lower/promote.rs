//! torch's type promotion (`torch.result_type`): tensors with dimensions outrank zero-dim
//! tensors, which outrank Python scalars, unless the lower group has a higher category.

use tpuc_fx::DType;

/// How an operand takes part in promotion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Participant {
    /// A tensor with at least one dimension.
    Dim(DType),
    /// A zero-dimensional tensor.
    ZeroDim(DType),
    /// A Python number (bool, int or float), which torch "wraps".
    Scalar(DType),
}

fn category(d: DType) -> u8 {
    if d == DType::Bool {
        0
    } else if d.is_complex() {
        3
    } else if d.is_float() {
        2
    } else {
        1
    }
}

/// `torch.promote_types` for the supported dtypes.
pub fn promote_types(a: DType, b: DType) -> DType {
    use DType::*;
    if a == b {
        return a;
    }
    match (category(a), category(b)) {
        (0, _) => return b,
        (_, 0) => return a,
        // Complex with anything: complex parts wide enough for both (float64 makes complex128).
        (3, _) | (_, 3) => {
            return if a == C128 || b == C128 || a == F64 || b == F64 {
                C128
            } else {
                C64
            }
        }
        (2, 1) => return a,
        (1, 2) => return b,
        _ => {}
    }
    if a.is_float() {
        return match (a, b) {
            (F16, BF16) | (BF16, F16) => F32,
            _ if a.byte_size() >= b.byte_size() => a,
            _ => b,
        };
    }
    // Integers: unsigned with signed needs a signed type wide enough for both.
    let signed = |d: DType| matches!(d, I8 | I16 | I32 | I64);
    match (signed(a), signed(b)) {
        (true, true) | (false, false) => {
            if a.byte_size() >= b.byte_size() {
                a
            } else {
                b
            }
        }
        _ => {
            let (s, u) = if signed(a) { (a, b) } else { (b, a) };
            if s.byte_size() > u.byte_size() {
                s
            } else {
                match u.byte_size() {
                    1 => I16,
                    2 => I32,
                    _ => I64,
                }
            }
        }
    }
}

fn combine(higher: Option<DType>, lower: Option<DType>) -> Option<DType> {
    match (higher, lower) {
        (None, l) => l,
        (h, None) => h,
        (Some(h), Some(l)) => {
            if category(h) >= category(l) && category(h) >= 2 {
                Some(h)
            } else if h == DType::Bool || category(l) > category(h) {
                Some(promote_types(h, l))
            } else {
                Some(h)
            }
        }
    }
}

/// The dtype torch computes an element-wise op of these operands in.
pub fn result_type(operands: &[Participant]) -> Option<DType> {
    let (mut dim, mut zero, mut wrapped): (Option<DType>, Option<DType>, Option<DType>) =
        (None, None, None);
    let fold = |acc: Option<DType>, d: DType| Some(acc.map_or(d, |a| promote_types(a, d)));
    for p in operands {
        match *p {
            Participant::Dim(d) => dim = fold(dim, d),
            Participant::ZeroDim(d) => zero = fold(zero, d),
            Participant::Scalar(d) => {
                // A Python float takes the default dtype (float32), a complex number complex64;
                // int is int64; bool is bool.
                let d = if d.is_float() {
                    DType::F32
                } else if d.is_complex() {
                    DType::C64
                } else {
                    d
                };
                wrapped = fold(wrapped, d)
            }
        }
    }
    combine(dim, combine(zero, wrapped))
}

#[cfg(test)]
mod tests {
    use super::*;
    use DType::*;
    use Participant::*;

    #[test]
    fn matches_torch_result_type() {
        assert_eq!(result_type(&[Dim(F32), Dim(I64)]), Some(F32));
        assert_eq!(result_type(&[Dim(I64), Scalar(F64)]), Some(F32));
        assert_eq!(result_type(&[Dim(I32), Scalar(I64)]), Some(I32));
        assert_eq!(result_type(&[Dim(F16), Dim(F32)]), Some(F32));
        assert_eq!(result_type(&[Dim(F16), ZeroDim(F32)]), Some(F16));
        assert_eq!(result_type(&[Dim(I32), ZeroDim(F64)]), Some(F64));
        assert_eq!(result_type(&[Dim(Bool), Scalar(I64)]), Some(I64));
        assert_eq!(result_type(&[Dim(U8), Dim(I8)]), Some(I16));
        assert_eq!(result_type(&[Dim(F16), Dim(BF16)]), Some(F32));
        assert_eq!(result_type(&[Dim(U8), Scalar(I64)]), Some(U8));
        assert_eq!(result_type(&[Dim(C64), Dim(F64)]), Some(C128));
        assert_eq!(result_type(&[Dim(F32), ZeroDim(C64)]), Some(C64));
        assert_eq!(result_type(&[Dim(C64), ZeroDim(F64)]), Some(C64));
        assert_eq!(result_type(&[Dim(I64), Scalar(C64)]), Some(C64));
        assert_eq!(result_type(&[Dim(F16), Dim(C64)]), Some(C64));
    }
}
