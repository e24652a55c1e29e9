//! Updates in place: each argument named gives its buffer to the result holding its new value
//! (`ArgAttrs::aliased_result`), so a caller that donates the argument gets the result written
//! where the argument was.

use crate::ir::{verify, Module, VerifyError};

/// `module` with each argument of `donations` (argument position, result index) aliased to its
/// result. The request comes from outside the compiler, so the module is verified whatever the
/// pipeline's setting: a result of another type, or one two arguments claim, is refused.
pub fn donate(mut module: Module, donations: &[(usize, usize)]) -> Result<Module, VerifyError> {
    if donations.is_empty() {
        return Ok(module);
    }
    let args = module.main.args().len();
    for &(position, result) in donations {
        if position >= args {
            return Err(VerifyError {
                place: "donation".into(),
                invariant: format!("no argument {position} to update in place ({args} arguments)"),
                after: None,
            });
        }
        let mut attrs = module.main.arg_attrs()[position].clone();
        attrs.aliased_result = Some(result);
        module.main.set_arg_attrs(position, attrs);
    }
    verify(&module).map_err(|e| e.after("updating arguments in place"))?;
    Ok(module)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{ArgAttrs, BinaryOp, Builder, DType, TensorType};

    /// `(a: f32[4], b: i32[4], c: f32[4]) -> (a + a, b)`.
    fn module() -> Module {
        let mut b = Builder::new();
        let x = b.arg(TensorType::new(vec![4], DType::F32), ArgAttrs::default());
        let y = b.arg(TensorType::new(vec![4], DType::I32), ArgAttrs::default());
        b.arg(TensorType::new(vec![4], DType::F32), ArgAttrs::default());
        let sum = b.binary(BinaryOp::Add, x, x).unwrap();
        Module::new(b.finish(vec![sum, y], vec![]))
    }

    #[test]
    fn an_argument_gives_its_buffer_to_its_result() {
        let m = donate(module(), &[(0, 0), (1, 1)]).unwrap();
        let aliased: Vec<_> = m
            .main
            .arg_attrs()
            .iter()
            .map(|a| a.aliased_result)
            .collect();
        assert_eq!(aliased, [Some(0), Some(1), None]);
        assert_eq!(
            donate(module(), &[]).unwrap().main.arg_attrs(),
            module().main.arg_attrs()
        );
    }

    #[test]
    fn requests_the_module_cannot_honour_are_refused() {
        for (request, why) in [
            (vec![(3, 0)], "no argument 3"),
            (vec![(0, 1)], "not one of its type"),
            (vec![(0, 0), (2, 0)], "another argument"),
            (vec![(1, 5)], "not one of its type"),
        ] {
            let e = donate(module(), &request).unwrap_err().to_string();
            assert!(e.contains(why), "{request:?}: {e}");
        }
    }
}
