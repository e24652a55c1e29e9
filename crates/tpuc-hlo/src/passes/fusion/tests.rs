//! Patterns matched on IR built as tpuc lowers the ops, and near misses that must not match.

use super::*;
use crate::ir::{print, verify, ArgAttrs, Builder, TensorType};
use crate::passes::{pipeline, PipelineOptions};

fn f32s(shape: &[i64]) -> TensorType {
    TensorType::new(shape.to_vec(), DType::F32)
}

/// How RMSNorm's ops vary in the near misses.
#[derive(Clone, Copy, Default)]
struct Variant {
    /// eps added after the square root instead of under it.
    eps_outside: bool,
    /// The mean taken over the first dimension.
    first_dim: bool,
    /// No weight.
    unweighted: bool,
    /// eps an argument (as the tpuc device's programs take an op's floats), not a constant.
    eps_operand: bool,
}

/// `x * rsqrt(mean(x * x, -1, keepdim) + eps) * w` as tpuc lowers it (x: [2, 8, 32]).
fn rms_norm(v: Variant) -> Module {
    let mut b = Builder::new();
    let w = b.arg(f32s(&[32]), ArgAttrs::default());
    let x = b.arg(f32s(&[2, 8, 32]), ArgAttrs::default());
    let squares = b.binary(BinaryOp::Mul, x, x).unwrap();
    let (dim, kept) = if v.first_dim {
        (0, vec![1, 8, 32])
    } else {
        (2, vec![2, 8, 1])
    };
    let summed = b.reduce_by(squares, &[dim], BinaryOp::Add).unwrap();
    let summed = b.reshape(summed, &kept).unwrap();
    let n = b.scalar(DType::F32, [2.0, 32.0][usize::from(!v.first_dim)]);
    let n = b.broadcast_in_dim(n, &kept, &[]).unwrap();
    let mean = b.binary(BinaryOp::Div, summed, n).unwrap();
    let eps = if v.eps_operand {
        b.arg(TensorType::scalar(DType::F32), ArgAttrs::default())
    } else {
        b.scalar(DType::F32, 1e-6)
    };
    let eps = b.broadcast_in_dim(eps, &kept, &[]).unwrap();
    let scale = if v.eps_outside {
        let r = b.unary(UnaryOp::Rsqrt, mean).unwrap();
        b.binary(BinaryOp::Add, r, eps).unwrap()
    } else {
        let shifted = b.binary(BinaryOp::Add, mean, eps).unwrap();
        b.unary(UnaryOp::Rsqrt, shifted).unwrap()
    };
    let scale = b.broadcast_in_dim(scale, &[2, 8, 32], &[0, 1, 2]).unwrap();
    let normed = b.binary(BinaryOp::Mul, x, scale).unwrap();
    let out = if v.unweighted {
        normed
    } else {
        let w = b.broadcast_in_dim(w, &[2, 8, 32], &[2]).unwrap();
        b.binary(BinaryOp::Mul, w, normed).unwrap()
    };
    Module::new(b.finish(vec![out], vec![]))
}

fn fused(m: Module) -> Module {
    fused_by(m, Fusion::Patterns)
}

fn fused_by(m: Module, fusion: Fusion) -> Module {
    let options = PipelineOptions {
        fusion,
        verify: true,
        ..PipelineOptions::default()
    };
    pipeline(m, &options).unwrap().main
}

fn composites(m: &Module) -> Vec<(String, Vec<(String, AttrValue)>)> {
    m.main
        .ops()
        .iter()
        .filter_map(|op| match op.kind() {
            OpKind::Composite {
                name, attributes, ..
            } => Some((name.clone(), attributes.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn rms_norm_becomes_one_composite_with_its_epsilon() {
    for unweighted in [false, true] {
        let m = fused(rms_norm(Variant {
            unweighted,
            ..Variant::default()
        }));
        verify(&m).unwrap();
        let text = print(&m);
        assert_eq!(
            composites(&m),
            [(
                "tpuc.rms_norm".to_string(),
                vec![("epsilon".to_string(), AttrValue::f32(1e-6))]
            )],
            "{text}"
        );
        // Nothing else is left in main but what reads the weight for the composite.
        assert_eq!(m.main.ops().len(), 1, "{text}");
        assert!(text.contains("func private @tpuc_rms_norm_impl("), "{text}");
    }
}

#[test]
fn an_epsilon_the_program_takes_is_an_operand_not_an_attribute() {
    let m = fused(rms_norm(Variant {
        eps_operand: true,
        ..Variant::default()
    }));
    assert_eq!(
        composites(&m),
        [("tpuc.rms_norm".to_string(), vec![])],
        "{}",
        print(&m)
    );
    let op = &m.main.ops()[0];
    assert_eq!(
        op.operands().len(),
        3,
        "x, the weight and eps: {}",
        print(&m)
    );
}

#[test]
fn near_misses_are_left_as_they_are() {
    for (what, v) in [
        (
            "eps after the square root",
            Variant {
                eps_outside: true,
                ..Variant::default()
            },
        ),
        (
            "the mean over another dimension",
            Variant {
                first_dim: true,
                ..Variant::default()
            },
        ),
    ] {
        let m = fused(rms_norm(v));
        assert!(composites(&m).is_empty(), "{what}: {}", print(&m));
    }
}

#[test]
fn a_match_whose_inner_values_are_read_elsewhere_is_not_outlined() {
    // The mean of squares is returned too: outlining would hide it.
    let m = rms_norm(Variant::default());
    let mean = m
        .main
        .ops()
        .iter()
        .find(|op| *op.kind() == OpKind::Binary(BinaryOp::Div))
        .and_then(|op| op.result())
        .unwrap();
    // The same function with the mean as a second result.
    let mut copy = Builder::new();
    let w2 = copy.arg(f32s(&[32]), ArgAttrs::default());
    let x2 = copy.arg(f32s(&[2, 8, 32]), ArgAttrs::default());
    let mut map = std::collections::HashMap::new();
    map.insert(m.main.args()[0], w2);
    map.insert(m.main.args()[1], x2);
    for op in m.main.ops() {
        let operands: Vec<Value> = op.operands().iter().map(|v| map[v]).collect();
        for (&old, new) in op
            .results()
            .iter()
            .zip(copy.op(op.kind().clone(), &operands).unwrap())
        {
            map.insert(old, new);
        }
    }
    let leaked = Module::new(copy.finish(vec![map[&m.main.results()[0]], map[&mean]], vec![]));
    let out = fused(leaked);
    assert!(composites(&out).is_empty(), "{}", print(&out));
}

/// An attention composite (its decomposition a stand-in: q + k + v) over keys and values whose
/// 2 heads a model repeated to the query's 4; `leak`: the repeated keys are returned too.
fn grouped_attention(leak: bool) -> Module {
    let mut b = Builder::new();
    let q = b.arg(f32s(&[1, 4, 8, 16]), ArgAttrs::default());
    let k = b.arg(f32s(&[1, 2, 8, 16]), ArgAttrs::default());
    let v = b.arg(f32s(&[1, 2, 8, 16]), ArgAttrs::default());
    let mut repeated = Vec::new();
    for x in [k, v] {
        let one = b.reshape(x, &[1, 2, 1, 8, 16]).unwrap();
        let wide = b
            .broadcast_in_dim(one, &[1, 2, 2, 8, 16], &[0, 1, 2, 3, 4])
            .unwrap();
        repeated.push(b.reshape(wide, &[1, 4, 8, 16]).unwrap());
    }
    let types = vec![f32s(&[1, 4, 8, 16]); 3];
    let stand_in = b
        .region(&types, |b, a| {
            let qk = b.binary(BinaryOp::Add, a[0], a[1])?;
            Ok(vec![b.binary(BinaryOp::Add, qk, a[2])?])
        })
        .unwrap();
    let out = b
        .composite(
            attention::ATTENTION,
            vec![],
            1,
            stand_in,
            &[q, repeated[0], repeated[1]],
        )
        .unwrap();
    let mut results = out;
    if leak {
        results.push(repeated[0]);
    }
    Module::new(b.finish(results, vec![]))
}

#[test]
fn attention_reads_keys_and_values_before_their_heads_are_repeated() {
    let m = fused(grouped_attention(false));
    verify(&m).unwrap();
    let text = print(&m);
    let op = &m.main.ops()[0];
    assert!(matches!(op.kind(), OpKind::Composite { .. }), "{text}");
    assert_eq!(m.main.ops().len(), 1, "the repeats moved inside: {text}");
    let heads: Vec<i64> = op
        .operands()
        .iter()
        .map(|&v| m.main.ty(v).shape[1])
        .collect();
    assert_eq!(heads, [4, 2, 2], "{text}");
    // Repeated keys read elsewhere stay as they are.
    let m = fused(grouped_attention(true));
    let composite = m
        .main
        .ops()
        .iter()
        .find(|op| matches!(op.kind(), OpKind::Composite { .. }))
        .unwrap();
    let heads: Vec<i64> = composite
        .operands()
        .iter()
        .map(|&v| m.main.ty(v).shape[1])
        .collect();
    assert_eq!(heads, [4, 4, 2], "{}", print(&m));
}

/// `silu(x @ wg) * (x @ wu)` (or, as near misses, with ReLU, or with the up projection of
/// another activation).
/// What multiplies the up projection in [`gated`]: an activation of the gate's product, or
/// `exp` of it, which is none.
#[derive(Clone, Copy)]
enum Gate {
    Silu,
    Relu,
    Exp,
}

/// `gate(x @ wg) * (x @ wu)`; `other_input`: the up projection of another `y`.
fn gated(gate_kind: Gate, other_input: bool) -> Module {
    let mut b = Builder::new();
    let x = b.arg(f32s(&[4, 8]), ArgAttrs::default());
    let y = b.arg(f32s(&[4, 8]), ArgAttrs::default());
    let wg = b.arg(f32s(&[16, 8]), ArgAttrs::default());
    let wu = b.arg(f32s(&[16, 8]), ArgAttrs::default());
    let dims = crate::ir::DotDims {
        lhs_batch: vec![],
        rhs_batch: vec![],
        lhs_contracting: vec![1],
        rhs_contracting: vec![1],
    };
    let precision = crate::ir::Precision::Highest;
    let gate = b.dot_general(x, wg, dims.clone(), precision).unwrap();
    let act = match gate_kind {
        Gate::Relu => {
            let zero = b.splat(&f32s(&[4, 16]), 0.0);
            b.binary(BinaryOp::Max, gate, zero).unwrap()
        }
        Gate::Silu => {
            let s = b.unary(UnaryOp::Logistic, gate).unwrap();
            b.binary(BinaryOp::Mul, gate, s).unwrap()
        }
        Gate::Exp => b.unary(UnaryOp::Exp, gate).unwrap(),
    };
    let up_input = if other_input { y } else { x };
    let up = b.dot_general(up_input, wu, dims, precision).unwrap();
    let out = b.binary(BinaryOp::Mul, act, up).unwrap();
    Module::new(b.finish(vec![out], vec![]))
}

#[test]
fn gated_products_become_gated_mlps_and_their_near_misses_do_not() {
    for (gate, name) in [(Gate::Silu, "silu"), (Gate::Relu, "relu")] {
        let m = fused(gated(gate, false));
        assert_eq!(
            composites(&m),
            [(
                "tpuc.gated_mlp".to_string(),
                vec![("activation".to_string(), AttrValue::Str(name.into()))]
            )],
            "{}",
            print(&m)
        );
    }
    for (gate, other) in [(Gate::Exp, false), (Gate::Silu, true)] {
        let m = fused(gated(gate, other));
        assert!(composites(&m).is_empty(), "{}", print(&m));
    }
}

#[test]
fn alike_matches_share_one_decomposition() {
    // Two norms of one shape, one's output the other's input: one function; the same norm
    // fused apart is alike, a gated MLP's decomposition is not.
    let norm = rms_norm(Variant::default()).main;
    let mut b = Builder::new();
    let w = b.arg(f32s(&[32]), ArgAttrs::default());
    let x = b.arg(f32s(&[2, 8, 32]), ArgAttrs::default());
    let once = b.inline(&norm, &[w, x]).unwrap();
    let twice = b.inline(&norm, &[w, once[0]]).unwrap();
    let m = fused(Module::new(b.finish(twice, vec![])));
    assert_eq!(composites(&m).len(), 2, "{}", print(&m));
    assert_eq!(m.callees().functions().len(), 1, "{}", print(&m));
    let other = fused(rms_norm(Variant::default()));
    assert!(!m.callees().functions()[0].1.func().same_as(
        &fused(gated(Gate::Silu, false)).callees().functions()[0]
            .1
            .func()
            .clone()
    ));
    assert!(m.callees().functions()[0]
        .1
        .func()
        .same_as(other.callees().functions()[0].1.func()));
}

/// `x * cos + rotate_half(x) * sin` over x: [1, 2, 4, 8]; `swapped`: the halves concatenated
/// the wrong way round (`cat(x_low, -x_high)`), which is no rotation.
fn rotary(swapped: bool) -> Module {
    let mut b = Builder::new();
    let x = b.arg(f32s(&[1, 2, 4, 8]), ArgAttrs::default());
    let cos = b.arg(f32s(&[4, 8]), ArgAttrs::default());
    let sin = b.arg(f32s(&[4, 8]), ArgAttrs::default());
    let low = b
        .slice(x, &[0, 0, 0, 0], &[1, 2, 4, 4], &[1, 1, 1, 1])
        .unwrap();
    let high = b
        .slice(x, &[0, 0, 0, 4], &[1, 2, 4, 8], &[1, 1, 1, 1])
        .unwrap();
    let neg = b.unary(UnaryOp::Neg, high).unwrap();
    let parts = if swapped { [low, neg] } else { [neg, low] };
    let rotated = b.concatenate(&parts, 3).unwrap();
    let cos = b.broadcast_in_dim(cos, &[1, 2, 4, 8], &[2, 3]).unwrap();
    let sin = b.broadcast_in_dim(sin, &[1, 2, 4, 8], &[2, 3]).unwrap();
    let plain = b.binary(BinaryOp::Mul, x, cos).unwrap();
    let turned = b.binary(BinaryOp::Mul, rotated, sin).unwrap();
    let out = b.binary(BinaryOp::Add, plain, turned).unwrap();
    Module::new(b.finish(vec![out], vec![]))
}

#[test]
fn a_rotary_embedding_becomes_one_composite_and_a_wrong_rotation_does_not() {
    let m = fused(rotary(false));
    assert_eq!(
        composites(&m),
        [(
            "tpuc.rotary".to_string(),
            vec![("style".to_string(), AttrValue::Str("half".into()))]
        )],
        "{}",
        print(&m)
    );
    assert!(composites(&fused(rotary(true))).is_empty());
}

/// `act(x @ w + b)` over x: [4, 8]; `act` "relu" or "gelu"; without `bias`, a near miss.
fn linear(act: &str, bias: bool) -> Module {
    let mut b = Builder::new();
    let x = b.arg(f32s(&[4, 8]), ArgAttrs::default());
    let w = b.arg(f32s(&[16, 8]), ArgAttrs::default());
    let bias_arg = b.arg(f32s(&[16]), ArgAttrs::default());
    let dims = crate::ir::DotDims {
        lhs_batch: vec![],
        rhs_batch: vec![],
        lhs_contracting: vec![1],
        rhs_contracting: vec![1],
    };
    let mut y = b
        .dot_general(x, w, dims, crate::ir::Precision::Highest)
        .unwrap();
    if bias {
        let bb = b.broadcast_in_dim(bias_arg, &[4, 16], &[1]).unwrap();
        y = b.binary(BinaryOp::Add, y, bb).unwrap();
    }
    let out = match act {
        "relu" => {
            let zero = b.splat(&f32s(&[4, 16]), 0.0);
            b.binary(BinaryOp::Max, y, zero).unwrap()
        }
        _ => {
            let half = b.splat(&f32s(&[4, 16]), 0.5);
            let one = b.splat(&f32s(&[4, 16]), 1.0);
            let c = b.splat(&f32s(&[4, 16]), std::f64::consts::FRAC_1_SQRT_2);
            let t = b.binary(BinaryOp::Mul, y, c).unwrap();
            let e = b.unary(UnaryOp::Erf, t).unwrap();
            let p = b.binary(BinaryOp::Add, one, e).unwrap();
            let hx = b.binary(BinaryOp::Mul, half, y).unwrap();
            b.binary(BinaryOp::Mul, hx, p).unwrap()
        }
    };
    Module::new(b.finish(vec![out], vec![]))
}

#[test]
fn a_linear_layer_with_its_activation_becomes_one_composite() {
    for act in ["relu", "gelu"] {
        let m = fused(linear(act, true));
        assert_eq!(
            composites(&m),
            [(
                "tpuc.linear".to_string(),
                vec![("activation".to_string(), AttrValue::Str(act.into()))]
            )],
            "{}",
            print(&m)
        );
        assert!(composites(&fused(linear(act, false))).is_empty());
    }
}

/// How attention written out op by op is masked in [`written_attention`].
#[derive(Clone, Copy, PartialEq)]
enum Mask {
    None,
    /// A stored boolean mask hiding what follows each position (true: hidden).
    Causal,
    /// A stored mask hiding another pattern (the diagonal).
    Other,
    /// A mask added to the scores (an argument).
    Additive,
    /// A constant mask added to the scores: 0 where seen, the float's lowest where hidden.
    AdditiveCausal,
}

/// minGPT's attention as tpuc lowers it: `softmax(q @ k^T / sqrt(8), masked) @ v` over
/// [8, 16, 8] (batch times heads, positions, head size); the softmax its lowering's composite.
fn written_attention(mask: Mask, scale: bool) -> Module {
    let mut b = Builder::new();
    let q = b.arg(f32s(&[8, 16, 8]), ArgAttrs::default());
    let kt = b.arg(f32s(&[8, 8, 16]), ArgAttrs::default());
    let v = b.arg(f32s(&[8, 16, 8]), ArgAttrs::default());
    let additive = b.arg(f32s(&[2, 4, 16, 16]), ArgAttrs::default());
    let batched = |lhs: i64, rhs: i64| crate::ir::DotDims {
        lhs_batch: vec![0],
        rhs_batch: vec![0],
        lhs_contracting: vec![lhs],
        rhs_contracting: vec![rhs],
    };
    let scores = b
        .dot_general(q, kt, batched(2, 1), Default::default())
        .unwrap();
    let mut scores = b.reshape(scores, &[2, 4, 16, 16]).unwrap();
    if scale {
        let c = b.scalar(DType::F32, 8f64.sqrt());
        let c = b.op1(OpKind::OptimizationBarrier, &[c]).unwrap();
        let c = b.broadcast_in_dim(c, &[2, 4, 16, 16], &[]).unwrap();
        scores = b.binary(BinaryOp::Div, scores, c).unwrap();
    }
    match mask {
        Mask::Causal | Mask::Other => {
            let hidden: Vec<f64> = (0..16)
                .flat_map(|r| {
                    (0..16).map(move |c| {
                        f64::from(u8::from(if mask == Mask::Causal { c > r } else { c == r }))
                    })
                })
                .collect();
            let stored = b
                .dense(TensorType::new(vec![16, 16], DType::U8), &hidden)
                .unwrap();
            let zero = b.splat(&TensorType::new(vec![16, 16], DType::U8), 0.0);
            let pred = b.compare(crate::ir::CompareDir::Ne, stored, zero).unwrap();
            let pred = b.broadcast_in_dim(pred, &[2, 4, 16, 16], &[2, 3]).unwrap();
            let fill = b.scalar(DType::F32, f64::NEG_INFINITY);
            let fill = b.broadcast_in_dim(fill, &[2, 4, 16, 16], &[]).unwrap();
            scores = b.select(pred, fill, scores).unwrap();
        }
        Mask::Additive => scores = b.binary(BinaryOp::Add, scores, additive).unwrap(),
        Mask::AdditiveCausal => {
            let lowest: Vec<f64> = (0..16)
                .flat_map(|r| (0..16).map(move |c| if c > r { f64::from(f32::MIN) } else { 0.0 }))
                .collect();
            let stored = b.dense(f32s(&[16, 16]), &lowest).unwrap();
            let stored = b
                .broadcast_in_dim(stored, &[2, 4, 16, 16], &[2, 3])
                .unwrap();
            scores = b.binary(BinaryOp::Add, scores, stored).unwrap();
        }
        Mask::None => {}
    }
    let ty = f32s(&[2, 4, 16, 16]);
    let softmax = b
        .region(std::slice::from_ref(&ty), |b, a| {
            Ok(vec![b.unary(UnaryOp::Exp, a[0])?])
        })
        .unwrap();
    let p = b
        .composite(
            "tpuc.softmax",
            vec![("dim".into(), AttrValue::I64(3))],
            1,
            softmax,
            &[scores],
        )
        .unwrap()[0];
    let p = b.reshape(p, &[8, 16, 16]).unwrap();
    let out = b
        .dot_general(p, v, batched(2, 1), Default::default())
        .unwrap();
    Module::new(b.finish(vec![out], vec![]))
}

#[test]
fn attention_written_out_becomes_one_composite_causal_when_its_mask_says() {
    for (mask, scale, causal, operands) in [
        (Mask::Causal, true, true, 4),
        (Mask::Other, true, false, 4),
        (Mask::None, false, false, 3),
        (Mask::Additive, true, false, 4),
        (Mask::AdditiveCausal, true, true, 4),
    ] {
        let m = fused(written_attention(mask, scale));
        let found = composites(&m);
        let scale_attr = AttrValue::f32(if scale { 1.0 / 8f64.sqrt() as f32 } else { 1.0 });
        assert_eq!(
            found,
            vec![(
                "tpuc.attention".to_string(),
                vec![
                    ("scale".to_string(), scale_attr),
                    ("causal".to_string(), AttrValue::Bool(causal))
                ]
            )],
            "{}",
            print(&m)
        );
        let op = m
            .main
            .ops()
            .iter()
            .find(|op| op.kind().composite().is_some())
            .unwrap();
        assert_eq!(op.operands().len(), operands, "{}", print(&m));
    }
}

/// torch's attention over `keys` positions as its lowering's composite (a stand-in
/// decomposition with the products of the lowering, `q @ transpose(k)` and `scores @ v`, the
/// key/value heads repeated for the query's: the registry replaces the rest), `results` 2 for
/// the flash form's log-sum-exp.
fn long_attention(heads: i64, kv_heads: i64, keys: i64, results: usize) -> Module {
    let mut b = Builder::new();
    let q = b.arg(f32s(&[1, heads, keys, 16]), ArgAttrs::default());
    let k = b.arg(f32s(&[1, kv_heads, keys, 16]), ArgAttrs::default());
    let v = b.arg(f32s(&[1, kv_heads, keys, 16]), ArgAttrs::default());
    let types = [b.ty(q).clone(), b.ty(k).clone(), b.ty(v).clone()];
    let dims = crate::ir::DotDims {
        lhs_batch: vec![0, 1],
        rhs_batch: vec![0, 1],
        lhs_contracting: vec![3],
        rhs_contracting: vec![2],
    };
    let stand_in = b
        .region(&types, |b, a| {
            let repeat = |b: &mut Builder, x| -> crate::ir::BuildResult<_> {
                if heads == kv_heads {
                    return Ok(x);
                }
                let split = b.reshape(x, &[1, kv_heads, 1, keys, 16])?;
                let wide = [1, kv_heads, heads / kv_heads, keys, 16];
                let wide = b.broadcast_in_dim(split, &wide, &[0, 1, 2, 3, 4])?;
                b.reshape(wide, &[1, heads, keys, 16])
            };
            let (k, v) = (repeat(b, a[1])?, repeat(b, a[2])?);
            let kt = b.transpose(k, &[0, 1, 3, 2])?;
            let scores = b.dot_general(a[0], kt, dims.clone(), Default::default())?;
            let out = b.dot_general(scores, v, dims.clone(), Default::default())?;
            let mut r = vec![out];
            if results == 2 {
                r.push(b.reduce_by(scores, &[3], BinaryOp::Add)?);
            }
            Ok(r)
        })
        .unwrap();
    let attributes = vec![
        ("scale".to_string(), AttrValue::f32(0.25)),
        ("causal".to_string(), AttrValue::Bool(true)),
    ];
    let out = b
        .composite(attention::ATTENTION, attributes, 1, stand_in, &[q, k, v])
        .unwrap();
    Module::new(b.finish(out, vec![]))
}

/// The decomposition of `m`'s attention composite.
fn attention_decomposition(m: &Module) -> Func {
    m.main
        .ops()
        .iter()
        .find_map(|op| match op.kind().composite() {
            Some((attention::ATTENTION, _, decomposition)) => Some(decomposition.func().clone()),
            _ => None,
        })
        .unwrap()
}

#[test]
fn the_registry_computes_a_written_out_causal_mask_from_positions() {
    for (mask, from_positions) in [
        (Mask::Causal, true),
        (Mask::AdditiveCausal, true),
        (Mask::Other, false),
        (Mask::Additive, false),
        (Mask::None, false),
    ] {
        let m = fused_by(written_attention(mask, true), Fusion::Kernels);
        let text = print(&m);
        let f = attention_decomposition(&m);
        let iota = f
            .ops()
            .iter()
            .any(|op| matches!(op.kind(), OpKind::Iota { .. }));
        assert_eq!(iota, from_positions, "{text}");
        if from_positions {
            // The stored mask is no longer read: its operand is left unused.
            let mask_arg = f.args()[2];
            assert!(
                f.ops().iter().all(|op| !op.operands().contains(&mask_arg)),
                "{text}"
            );
        }
    }
}

#[test]
fn roles_are_read_off_the_products_keys_transposed_where_written_out() {
    let m = fused(written_attention(Mask::Causal, true));
    assert_eq!(
        kernels::roles(&attention_decomposition(&m)),
        Some((0, 1, 3, true)),
        "{}",
        print(&m)
    );
    let m = long_attention(4, 2, 512, 1);
    assert_eq!(
        kernels::roles(&attention_decomposition(&m)),
        Some((0, 1, 2, false))
    );
    // Products of other forms name no roles.
    let m = fused(gated(Gate::Silu, false));
    assert_eq!(kernels::roles(m.callees().functions()[0].1.func()), None);
}

#[test]
fn long_attention_is_computed_in_blocks_of_keys() {
    for (heads, kv_heads, keys, results, blocked) in [
        (2, 2, 1024, 2, true),
        (4, 2, 2048, 1, true),
        (2, 2, 512, 1, false),
        (2, 2, 1000, 1, false),
    ] {
        let mut f = long_attention(heads, kv_heads, keys, results).main;
        kernels::choose(&mut f).unwrap();
        let m = Module::new(f);
        verify(&m).unwrap();
        let text = print(&m);
        assert_eq!(
            text.contains("stablehlo.while"),
            blocked,
            "{keys} keys:\n{text}"
        );
        if blocked {
            // The scores of one block of keys at a time.
            let block = format!("x{}x256xf32>", keys);
            assert!(
                text.contains(&block) && !text.contains(&format!("x{keys}x{keys}xf32>")),
                "{text}"
            );
        }
    }
}
