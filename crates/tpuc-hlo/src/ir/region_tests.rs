//! Ops with regions (`while`, `case`, calls): their builders, typing rules, the verifier's checks of
//! the functions they run, the printer, and passes reaching into them.

use super::*;
use crate::passes::{pipeline, PipelineOptions};

fn f32s(shape: &[i64]) -> TensorType {
    TensorType::new(shape.to_vec(), DType::F32)
}

/// A loop adding `x` to an accumulator `n` times (`n` an i32 argument).
fn counted_loop() -> Module {
    let mut b = Builder::new();
    let x = b.arg(f32s(&[2]), ArgAttrs::default());
    let n = b.arg(TensorType::scalar(DType::I32), ArgAttrs::default());
    let zero = b.scalar(DType::I32, 0.0);
    let results = b
        .while_loop(
            &[zero, x, n],
            |b, v| b.compare(CompareDir::Lt, v[0], v[2]),
            |b, v| {
                let one = b.scalar(DType::I32, 1.0);
                let i = b.binary(BinaryOp::Add, v[0], one)?;
                let twice = b.binary(BinaryOp::Add, v[1], v[1])?;
                Ok(vec![i, twice, v[2]])
            },
        )
        .unwrap();
    Module::new(b.finish(vec![results[1]], vec![]))
}

#[test]
fn a_loop_is_built_typed_verified_and_printed_with_its_regions() {
    let m = counted_loop();
    verify(&m).unwrap();
    assert_eq!(
        print(&m),
        "func @main(%0: tensor<2xf32>, %1: tensor<i32>) {
  %2 = stablehlo.constant splat=0 : tensor<i32>
  %3, %4, %5 = stablehlo.while %2, %0, %1 : tensor<i32>, tensor<2xf32>, tensor<i32>
    cond(%3: tensor<i32>, %4: tensor<2xf32>, %5: tensor<i32>) {
      %6 = stablehlo.compare %3, %5 dir=LT type=SIGNED : tensor<i1>
      return %6
    }
    body(%3: tensor<i32>, %4: tensor<2xf32>, %5: tensor<i32>) {
      %6 = stablehlo.constant splat=1 : tensor<i32>
      %7 = stablehlo.add %3, %6 : tensor<i32>
      %8 = stablehlo.add %4, %4 : tensor<2xf32>
      return %7, %8, %5
    }
  return %4
}
"
    );
}

#[test]
fn a_region_of_the_wrong_signature_is_refused_by_name() {
    let mut b = Builder::new();
    let x = b.arg(f32s(&[2]), ArgAttrs::default());
    let body_changes_the_shape = b.while_loop(
        &[x],
        |b, _| Ok(b.scalar(DType::Bool, 1.0)),
        |b, v| Ok(vec![b.concatenate(&[v[0], v[0]], 0)?]),
    );
    let message = body_changes_the_shape.unwrap_err().to_string();
    assert!(
        message.contains("the body returns (tensor<4xf32>), the op needs (tensor<2xf32>)"),
        "{message}"
    );
    let condition_not_a_boolean = b.while_loop(
        &[x],
        |b, _| Ok(b.scalar(DType::I32, 1.0)),
        |_, v| Ok(v.to_vec()),
    );
    let message = condition_not_a_boolean.unwrap_err().to_string();
    assert!(
        message.contains("the condition returns (tensor<i32>)"),
        "{message}"
    );
}

#[test]
fn branches_take_the_operands_and_agree_on_their_results() {
    let mut b = Builder::new();
    let index = b.arg(TensorType::scalar(DType::I32), ArgAttrs::default());
    let x = b.arg(f32s(&[3]), ArgAttrs::default());
    let same = b.region(&[f32s(&[3])], |_, v| Ok(vec![v[0]])).unwrap();
    let negated = b
        .region(&[f32s(&[3])], |b, v| Ok(vec![b.unary(UnaryOp::Neg, v[0])?]))
        .unwrap();
    let results = b.case(index, &[x], vec![same.clone(), negated]).unwrap();
    assert_eq!(b.ty(results[0]), &f32s(&[3]));

    let summed = b
        .region(&[f32s(&[3])], |b, v| {
            Ok(vec![b.reduce_by(v[0], &[0], BinaryOp::Add)?])
        })
        .unwrap();
    let message = b
        .case(index, &[x], vec![same.clone(), summed])
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("branch 1 returns (tensor<f32>), the op needs (tensor<3xf32>)"),
        "{message}"
    );
    let wide_index = b.convert(index, DType::I64);
    let message = b
        .case(wide_index, &[x], vec![same.clone()])
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("its index is a tensor<i32>, got tensor<i64>"),
        "{message}"
    );
    let message = b.case(index, &[], vec![same]).unwrap_err().to_string();
    assert!(
        message.contains("branch 0 takes (tensor<3xf32>), the op passes ()"),
        "{message}"
    );
    let message = b.case(index, &[x], vec![]).unwrap_err().to_string();
    assert!(message.contains("has at least one branch"), "{message}");
}

#[test]
fn a_region_reads_only_its_arguments() {
    let mut b = Builder::new();
    let x = b.arg(f32s(&[2]), ArgAttrs::default());
    // The builder refuses a value of the enclosing function...
    let refused = b.region(&[f32s(&[2])], |b, v| {
        Ok(vec![b.binary(BinaryOp::Add, v[0], x)?])
    });
    let message = refused.unwrap_err().to_string();
    assert!(
        message.contains("is not a value of this function"),
        "{message}"
    );
    // ...and the verifier one that got there anyway, naming the op and the region.
    let mut m = counted_loop();
    let OpKind::While { cond, body } = m.main.ops()[1].kind().clone() else {
        panic!("the loop is op 1");
    };
    let mut reads_outer = body.func().clone();
    reads_outer.ops[1].operands[0] = m.main.args()[0];
    m.main.ops[1].kind = OpKind::While {
        cond,
        body: Region::new(reads_outer),
    };
    let e = verify(&m).unwrap_err();
    assert_eq!(
        e.place,
        "op 1 (stablehlo.while) region 1: op 1 (stablehlo.add)"
    );
    assert!(
        e.invariant
            .contains("operand %0 is used before it is defined"),
        "{e}"
    );
}

#[test]
fn regions_compare_by_identity_and_kinds_say_what_they_run() {
    let m = counted_loop();
    let kind = m.main.ops()[1].kind();
    assert_eq!(kind.regions().len(), 2);
    assert_eq!(kind, &kind.clone());
    let copy = kind.with_regions(
        kind.regions()
            .into_iter()
            .map(|r| Region::new(r.func().clone()))
            .collect(),
    );
    assert_ne!(
        kind, &copy,
        "another function, though equal, is another region"
    );
    assert!(!kind.is_random() && !kind.is_collective());
}

#[test]
fn passes_over_one_function_reach_every_region() {
    // A body with dead code and a constant expression: folded and removed inside the region.
    let mut b = Builder::new();
    let x = b.arg(f32s(&[2]), ArgAttrs::default());
    let results = b
        .while_loop(
            &[x],
            |b, _| Ok(b.scalar(DType::Bool, 0.0)),
            |b, v| {
                let two = b.splat(&f32s(&[2]), 2.0);
                let four = b.binary(BinaryOp::Mul, two, two)?;
                let _unused = b.unary(UnaryOp::Exp, v[0])?;
                Ok(vec![b.binary(BinaryOp::Add, v[0], four)?])
            },
        )
        .unwrap();
    let m = Module::new(b.finish(results, vec![]));
    let options = PipelineOptions {
        verify: true,
        ..PipelineOptions::default()
    };
    let out = pipeline(m, &options).unwrap().main;
    let OpKind::While { body, .. } = out.main.ops().last().unwrap().kind() else {
        panic!("the loop remains");
    };
    assert_eq!(
        op_names(body.func()),
        ["stablehlo.constant", "stablehlo.add"],
        "{}",
        print(&out)
    );
    let OpKind::Constant(four) = body.func().ops()[0].kind() else {
        panic!("folded")
    };
    assert_eq!(four.bytes[..4], 4.0f32.to_le_bytes());
}

fn op_names(f: &Func) -> Vec<&'static str> {
    f.ops().iter().map(|op| op.kind().name()).collect()
}

/// A function doubling its argument and adding a constant expression (and computing something
/// it never uses), for calls.
fn doubling(b: &Builder) -> Region {
    b.region(&[f32s(&[2])], |b, v| {
        let two = b.splat(&f32s(&[2]), 2.0);
        let four = b.binary(BinaryOp::Mul, two, two)?;
        let _unused = b.unary(UnaryOp::Exp, v[0])?;
        let twice = b.binary(BinaryOp::Add, v[0], v[0])?;
        Ok(vec![b.binary(BinaryOp::Add, twice, four)?])
    })
    .unwrap()
}

/// A builder whose function calls one `doubling` function twice, and the second call's
/// results.
fn called_twice() -> (Builder, Vec<Value>) {
    let mut b = Builder::new();
    let x = b.arg(f32s(&[2]), ArgAttrs::default());
    let block = doubling(&b);
    let once = b.call("block", block.clone(), &[x]).unwrap();
    let twice = b.call("block", block, &once).unwrap();
    (b, twice)
}

#[test]
fn calls_of_one_function_share_it_once_named_and_printed() {
    let (mut b, twice) = called_twice();
    // Another function under the same name, and one named as the module's entry.
    let other = b.call("block", doubling(&b), &twice).unwrap();
    let last = b.call("main", doubling(&b), &other).unwrap();
    let m = Module::new(b.finish(last, vec![]));
    verify(&m).unwrap();
    let callees = m.callees();
    let names: Vec<&str> = callees
        .functions()
        .iter()
        .map(|(n, _)| n.as_str())
        .collect();
    assert_eq!(names, ["block", "block_1", "main_1"]);
    let text = print(&m);
    assert!(
        text.contains("%1 = func.call %0 @block : tensor<2xf32>")
            && text.contains("%2 = func.call %1 @block : tensor<2xf32>")
            && text.contains("func.call %2 @block_1")
            && text.contains("func.call %3 @main_1")
            && text.matches("func private @block(").count() == 1,
        "{text}"
    );
}

#[test]
fn a_call_of_the_wrong_signature_is_refused_by_name() {
    let mut b = Builder::new();
    let x = b.arg(f32s(&[3]), ArgAttrs::default());
    let block = doubling(&b);
    let e = b.call("block", block, &[x]).unwrap_err();
    assert!(
        e.to_string()
            .contains("@block takes (tensor<2xf32>), the op passes (tensor<3xf32>)"),
        "{e}"
    );
}

#[test]
fn passes_reach_a_called_function_once_and_keep_it_shared() {
    let (b, twice) = called_twice();
    let m = Module::new(b.finish(twice, vec![]));
    let options = PipelineOptions {
        verify: true,
        ..PipelineOptions::default()
    };
    let out = pipeline(m, &options).unwrap().main;
    let callees: Vec<&Region> = out
        .main
        .ops()
        .iter()
        .filter_map(|op| match op.kind() {
            OpKind::Call { callee, .. } => Some(callee),
            _ => None,
        })
        .collect();
    assert_eq!(callees.len(), 2, "{}", print(&out));
    assert_eq!(callees[0], callees[1], "one function for both calls");
    // The constant expression folded, the unused exponential gone.
    assert_eq!(
        op_names(callees[0].func()),
        ["stablehlo.constant", "stablehlo.add", "stablehlo.add"],
        "{}",
        print(&out)
    );
}

fn foreign_doubling() -> std::sync::Arc<ForeignFunction> {
    std::sync::Arc::new(ForeignFunction {
        name: "mylib.twice.default".into(),
        module: "\"builtin.module\"() ({}) : () -> ()".into(),
        operands: vec![f32s(&[2])],
        results: vec![f32s(&[2])],
    })
}

#[test]
fn a_kernel_called_twice_is_named_once_and_survives_the_passes() {
    let mut b = Builder::new();
    let x = b.arg(f32s(&[2]), ArgAttrs::default());
    let kernel = foreign_doubling();
    let once = b.op(OpKind::Foreign(kernel.clone()), &[x]).unwrap();
    let twice = b.op(OpKind::Foreign(kernel), &once).unwrap();
    // A call of the kernel whose result nothing reads goes with the other dead code.
    b.op(OpKind::Foreign(foreign_doubling()), &[x]).unwrap();
    let m = Module::new(b.finish(twice, vec![]));
    verify(&m).unwrap();
    let options = PipelineOptions {
        verify: true,
        ..PipelineOptions::default()
    };
    let out = pipeline(m, &options).unwrap().main;
    let callees = out.callees();
    let names: Vec<&str> = callees.foreign().iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["mylib_twice_default"]);
    let text = print(&out);
    assert!(
        text.matches("func.call").count() == 2
            && text.contains("@mylib_twice_default : tensor<2xf32>")
            && text
                .contains("func private @mylib_twice_default: the kernel of mylib.twice.default"),
        "{text}"
    );
}

#[test]
fn a_kernel_of_other_operand_types_is_refused_by_name() {
    let mut b = Builder::new();
    let x = b.arg(f32s(&[3]), ArgAttrs::default());
    let e = b.op(OpKind::Foreign(foreign_doubling()), &[x]).unwrap_err();
    assert!(
        e.to_string().contains(
            "the kernel of mylib.twice.default takes (tensor<2xf32>), the op passes (tensor<3xf32>)"
        ),
        "{e}"
    );
}
