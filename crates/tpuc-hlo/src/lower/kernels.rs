//! Custom ops a user's kernel computes (`tpuc.jax_op`): the program carries, per op and
//! signature, the kernel's StableHLO (`tpuc_fx::kernels`); a call of the op becomes a call of
//! that function, spliced into the module as a private function by the emitter.

use std::rc::Rc;
use std::sync::{Arc, LazyLock};

use tpuc_fx::kernels::Kernel;
use tpuc_fx::{Arg, Node, Program};

use super::ctx::{output_slots, Ctx, OpError, OpResult};
use super::registry::{Lowering, Variant};
use super::LowerFn;
use crate::ir::{ForeignFunction, OpKind, TensorType, Value};

/// A kernel as the lowering uses it: its op, the types it takes and its function.
pub(super) struct UserKernel {
    op: String,
    inputs: Vec<TensorType>,
    operands: Vec<usize>,
    function: Arc<ForeignFunction>,
}

/// The kernels of `program`, one function each (calls of one kernel share it).
pub(super) fn user_kernels(program: &Program) -> Rc<[UserKernel]> {
    program.kernels().iter().map(user_kernel).collect()
}

fn user_kernel(k: &Kernel) -> UserKernel {
    let types = |ts: &[tpuc_fx::kernels::KernelTensor]| -> Vec<TensorType> {
        ts.iter()
            .map(|t| TensorType::new(t.shape.clone(), t.dtype))
            .collect()
    };
    let inputs = types(&k.inputs);
    UserKernel {
        op: k.op.clone(),
        operands: k.operands.clone(),
        function: Arc::new(ForeignFunction {
            name: k.op.clone(),
            module: Arc::from(k.mlir.as_str()),
            operands: k.operands.iter().map(|&i| inputs[i].clone()).collect(),
            results: types(&k.outputs),
        }),
        inputs,
    }
}

/// Whether a kernel computes op `target`.
pub(super) fn has_kernel(kernels: &[UserKernel], target: &str) -> bool {
    kernels.iter().any(|k| k.op == target)
}

/// The lowering of an op a kernel computes.
pub(super) fn kernel_lowering() -> Lowering {
    static CALL: LazyLock<LowerFn> = LazyLock::new(|| Arc::new(call_kernel));
    Lowering {
        f: &CALL,
        variant: Variant::Functional,
        handles_complex: true,
    }
}

/// The node's op computed by the kernel of its operand types.
fn call_kernel(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let mut operands = Vec::new();
    for a in &n.inputs {
        match &a.arg {
            Arg::Tensor(t) => operands.push(cx.value(t)?),
            other => {
                return Err(OpError(format!(
                    "a kernel's op takes tensors only; its argument {} is of kind {}",
                    a.name,
                    other.kind_name()
                )))
            }
        }
    }
    let types: Vec<TensorType> = operands.iter().map(|&v| cx.b.ty(v).clone()).collect();
    let kernels = cx.kernels.clone();
    let Some(kernel) = kernels
        .iter()
        .find(|k| k.op == n.target && k.inputs == types)
    else {
        let given: Vec<String> = kernels
            .iter()
            .filter(|k| k.op == n.target)
            .map(|k| signature(&k.inputs))
            .collect();
        return Err(OpError(format!(
            "no kernel of {} takes {}; the program has kernels for {} (a kernel is made for \
             each signature the op is called with when the program is traced)",
            n.target,
            signature(&types),
            given.join(", ")
        )));
    };
    let slots = output_slots(n);
    let results = &kernel.function.results;
    if slots.len() != results.len() {
        return Err(OpError(format!(
            "its kernel returns {} tensors, the graph's node {}",
            results.len(),
            slots.len()
        )));
    }
    for (i, result) in results.iter().enumerate() {
        if let Some(recorded) = cx.opt_out_type(n, i)? {
            if recorded != *result {
                return Err(OpError(format!(
                    "its kernel returns a {result} as output {i}, where the graph records a \
                     {recorded} (the op's fake implementation disagrees with the kernel)"
                )));
            }
        }
    }
    let passed: Vec<Value> = kernel.operands.iter().map(|&i| operands[i]).collect();
    let values = cx.b.op(OpKind::Foreign(kernel.function.clone()), &passed)?;
    Ok(values.into_iter().map(Some).collect())
}

fn signature(types: &[TensorType]) -> String {
    let each: Vec<String> = types.iter().map(ToString::to_string).collect();
    format!("({})", each.join(", "))
}
