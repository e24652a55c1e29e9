//! Matrix products and attention.

use tpuc_fx::Node;

use super::prelude::*;

/// `a @ b` for a [batch.., M, K] and b [batch.., K, N] with equal batch dimensions.
pub fn batched_matmul(cx: &mut Ctx, a: Value, b: Value) -> OpResult<Value> {
    let ra = cx.b.ty(a).rank() as i64;
    let rb = cx.b.ty(b).rank() as i64;
    if ra != rb || ra < 2 {
        return err(format!(
            "matmul of {} and {} needs equal ranks of at least 2",
            cx.b.ty(a),
            cx.b.ty(b)
        ));
    }
    let batch: Vec<i64> = (0..ra - 2).collect();
    let dims = DotDims {
        lhs_batch: batch.clone(),
        rhs_batch: batch,
        lhs_contracting: vec![ra - 1],
        rhs_contracting: vec![rb - 2],
    };
    dot(cx, a, b, dims)
}

/// torch.matmul with its 1-d and broadcasting rules.
fn matmul_general(cx: &mut Ctx, a: Value, b: Value) -> OpResult<Value> {
    let (sa, sb) = (cx.b.shape(a).to_vec(), cx.b.shape(b).to_vec());
    let a2 = if sa.len() == 1 {
        cx.b.reshape(a, &[1, sa[0]])?
    } else {
        a
    };
    let b2 = if sb.len() == 1 {
        cx.b.reshape(b, &[sb[0], 1])?
    } else {
        b
    };
    let (sa2, sb2) = (cx.b.shape(a2).to_vec(), cx.b.shape(b2).to_vec());
    let batch =
        broadcast_shapes(&sa2[..sa2.len() - 2], &sb2[..sb2.len() - 2]).ok_or_else(|| {
            OpError(format!(
                "batch dimensions of {sa:?} and {sb:?} do not broadcast"
            ))
        })?;
    let mut ta = batch.clone();
    ta.extend_from_slice(&sa2[sa2.len() - 2..]);
    let mut tb = batch.clone();
    tb.extend_from_slice(&sb2[sb2.len() - 2..]);
    let a3 = cx.b.broadcast_to(a2, &ta)?;
    let b3 = cx.b.broadcast_to(b2, &tb)?;
    let r = batched_matmul(cx, a3, b3)?;
    let mut out = batch;
    if sa.len() > 1 {
        out.push(sa[sa.len() - 2]);
    }
    if sb.len() > 1 {
        out.push(sb[sb.len() - 1]);
    }
    Ok(cx.b.reshape(r, &out)?)
}

fn linear(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let mut xw = [cx.tensor(n, "input")?, cx.tensor(n, "weight")?];
    let bias = cx.opt_tensor(n, "bias")?;
    let half = widened(cx, &mut xw);
    let [x, w] = xw;
    let rx = cx.b.ty(x).rank() as i64;
    let dims = DotDims {
        lhs_batch: vec![],
        rhs_batch: vec![],
        lhs_contracting: vec![rx - 1],
        rhs_contracting: vec![cx.b.ty(w).rank() as i64 - 1],
    };
    let mut y = dot(cx, x, w, dims)?;
    if let Some(bias) = bias {
        let bias = cx.b.convert(bias, cx.b.elem(y));
        let shape = cx.b.shape(y).to_vec();
        let bias = cx.b.broadcast_to(bias, &shape)?;
        y = cx.b.binary(BinaryOp::Add, y, bias)?;
    }
    Ok(vec![Some(narrowed(cx, y, half))])
}

/// `beta * self + alpha * (lhs . rhs)` for the product `dims` describe: addmm (mat1 @ mat2),
/// addmv (mat @ vec), baddbmm (batched) and addbmm (batched, summed over the batch).
fn add_product(
    cx: &mut Ctx,
    n: &Node,
    names: [&str; 2],
    dims: impl Fn(usize, usize) -> DotDims,
) -> OpResult<Vec<Option<Value>>> {
    let mut operands = [
        cx.tensor(n, names[0])?,
        cx.tensor(n, names[1])?,
        cx.tensor(n, "self")?,
    ];
    let beta = cx.float(n, "beta", Some(1.0))?;
    let alpha = cx.float(n, "alpha", Some(1.0))?;
    let half = widened(cx, &mut operands);
    let [a, b, bias] = operands;
    let (ra, rb) = (cx.b.ty(a).rank(), cx.b.ty(b).rank());
    let p = precision(cx, cx.b.elem(a));
    let prod = cx.b.dot_general(a, b, dims(ra, rb), p)?;
    let prod = cx.scaled(prod, alpha)?;
    if beta == 0.0 {
        // torch ignores self (even NaN in it) when beta is 0.
        return Ok(vec![Some(narrowed(cx, prod, half))]);
    }
    let shape = cx.b.shape(prod).to_vec();
    let bias = cx.b.broadcast_to(bias, &shape)?;
    let bias = cx.scaled(bias, beta)?;
    let sum = cx.b.binary(BinaryOp::Add, prod, bias)?;
    Ok(vec![Some(narrowed(cx, sum, half))])
}

/// addbmm as torch's CPU kernel runs it: one addmm per batch into the result, which is stored
/// in its type after each (beta scales `self` in the first only):
/// r = beta self + alpha b1[0] b2[0], then r += alpha b1[i] b2[i].
fn addbmm(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let mut operands = [
        cx.tensor(n, "batch1")?,
        cx.tensor(n, "batch2")?,
        cx.tensor(n, "self")?,
    ];
    let beta = cx.float(n, "beta", Some(1.0))?;
    let alpha = cx.float(n, "alpha", Some(1.0))?;
    let stored = cx.b.elem(operands[0]);
    let half = widened(cx, &mut operands);
    let [a, b, bias] = operands;
    let (sa, sb) = (cx.b.shape(a).to_vec(), cx.b.shape(b).to_vec());
    if sa.len() != 3 || sb.len() != 3 || sa[0] != sb[0] || sa[2] != sb[1] {
        return err(format!(
            "addbmm needs batches [b, n, m] and [b, m, p], got {sa:?} and {sb:?}"
        ));
    }
    let p = precision(cx, cx.b.elem(a));
    let products = cx.b.dot_general(a, b, contract_last(1, 3, 1), p)?;
    let products = cx.scaled(products, alpha)?;
    let shape = vec![sa[1], sb[2]];
    let first = if beta == 0.0 {
        // torch ignores self (even NaN in it) when beta is 0.
        cx.b.splat(&TensorType::new(shape.clone(), cx.b.elem(a)), 0.0)
    } else {
        let bias = cx.b.broadcast_to(bias, &shape)?;
        cx.scaled(bias, beta)?
    };
    let mut result = first;
    for i in 0..sa[0] {
        let product = cx.b.slice_dim(products, 0, i, i + 1, 1)?;
        let product = cx.b.reshape(product, &shape)?;
        let sum = cx.b.binary(BinaryOp::Add, result, product)?;
        result = cx.rounded_to(sum, stored);
    }
    Ok(vec![Some(narrowed(cx, result, half))])
}

/// Contracts the last dim of the left operand with dim `rhs_contracting` of the right one,
/// over `batch` leading batch dims.
fn contract_last(batch: usize, ra: usize, rhs_contracting: usize) -> DotDims {
    let b: Vec<i64> = (0..batch as i64).collect();
    DotDims {
        lhs_batch: b.clone(),
        rhs_batch: b,
        lhs_contracting: vec![ra as i64 - 1],
        rhs_contracting: vec![rhs_contracting as i64],
    }
}

fn mm(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let a = cx.tensor(n, "self")?;
    let b = cx.tensor(n, "mat2")?;
    Ok(vec![Some(batched_matmul(cx, a, b)?)])
}

/// mask[p][g]: position `p` of the ragged dimension (of `size`) is in group `g`, whose
/// positions run from the previous group's end offset (0 for the first) to its own, `offs[g]`.
/// Positions past the last offset are in no group.
fn group_mask(cx: &mut Ctx, offs: Value, size: i64) -> OpResult<Value> {
    let groups = cx.b.shape(offs)[0];
    let ends = cx.b.convert(offs, DType::I64);
    let zero = cx.b.splat(&TensorType::new(vec![1], DType::I64), 0.0);
    let earlier = cx.b.slice(ends, &[0], &[groups - 1], &[1])?;
    let starts = cx.b.concatenate(&[zero, earlier], 0)?;
    let shape = [size, groups];
    let position = cx.b.iota(TensorType::new(shape.to_vec(), DType::I64), 0)?;
    let starts = cx.b.broadcast_in_dim(starts, &shape, &[1])?;
    let ends = cx.b.broadcast_in_dim(ends, &shape, &[1])?;
    let after_start = cx.b.compare(CompareDir::Ge, position, starts)?;
    let before_end = cx.b.compare(CompareDir::Lt, position, ends)?;
    Ok(cx.b.binary(BinaryOp::And, after_start, before_end)?)
}

/// `x` with the elements outside `mask` (broadcast along `dims` of x) set to zero.
fn masked(cx: &mut Ctx, x: Value, mask: Value, dims: &[i64]) -> OpResult<Value> {
    let shape = cx.b.shape(x).to_vec();
    let mask = cx.b.broadcast_in_dim(mask, &shape, dims)?;
    let zeros = cx.full_like(x, 0.0, None);
    Ok(cx.b.select(mask, x, zeros)?)
}

/// _grouped_mm(self, mat2, offs, bias, out_dtype): the matrix products of groups, as
/// mixture-of-experts layers call them. With `offs` (the groups' end offsets) one dimension
/// is ragged:
/// - [M, K] x [G, K, N] -> [M, N]: rows of self in group g times expert g;
/// - [M, K] x [K, N] -> [G, M, N]: the products over each group's slice of K;
/// - [G, M, K] x [K, N] -> [M, N]: columns of group g from self[g];
/// - without offsets, [G, M, K] x [G, K, N] is a batched product.
///
/// StableHLO has no ragged product (`ragged_dot` is a CHLO op the plugins need not know), so
/// each form is dense: every group's product over all positions, the positions outside the
/// group zeroed (on the operand for a ragged K, on the result otherwise). That costs G times
/// the work of a gather per row but is plain dot_general, which every plugin tiles well; a
/// gather of each row's expert would materialise an [M, K, N] tensor.
fn grouped_mm(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let a = cx.tensor(n, "self")?;
    let b = cx.tensor(n, "mat2")?;
    let offs = cx.opt_tensor(n, "offs")?;
    let out = cx.out_type(n, 0)?;
    let (ra, rb) = (cx.b.ty(a).rank(), cx.b.ty(b).rank());
    let elem = out.elem;
    let acc = elem.accumulation();
    let (a, b) = (cx.b.convert(a, acc), cx.b.convert(b, acc));
    let product = |cx: &mut Ctx, a: Value, b: Value, dims: DotDims| -> OpResult<Value> {
        let p = precision(cx, acc);
        Ok(cx.b.dot_general(a, b, dims, p)?)
    };
    let plain = |lhs_batch: Vec<i64>, rhs_batch: Vec<i64>, lc: i64, rc: i64| DotDims {
        lhs_batch,
        rhs_batch,
        lhs_contracting: vec![lc],
        rhs_contracting: vec![rc],
    };
    let y = match (ra, rb, offs) {
        (3, 3, None) => product(cx, a, b, plain(vec![0], vec![0], 2, 1))?,
        (2, 3, Some(offs)) => {
            // [M, K] x [G, K, N] -> [M, G, N], then each row's own group.
            let rows = cx.b.shape(a)[0];
            let all = product(cx, a, b, plain(vec![], vec![], 1, 1))?;
            let mask = group_mask(cx, offs, rows)?;
            let mine = masked(cx, all, mask, &[0, 1])?;
            cx.b.reduce_by(mine, &[1], BinaryOp::Add)?
        }
        (2, 2, Some(offs)) => {
            // Each group's slice of K: self's columns outside it zeroed -> [G, M, K] x [K, N].
            let (rows, depth) = (cx.b.shape(a)[0], cx.b.shape(a)[1]);
            let groups = cx.b.shape(offs)[0];
            let mask = group_mask(cx, offs, depth)?;
            let spread = cx.b.broadcast_in_dim(a, &[groups, rows, depth], &[1, 2])?;
            let mask = cx.b.transpose(mask, &[1, 0])?;
            let spread = masked(cx, spread, mask, &[0, 2])?;
            product(cx, spread, b, plain(vec![], vec![], 2, 0))?
        }
        (3, 2, Some(offs)) => {
            // [G, M, K] x [K, N] -> [G, M, N], then each column's own group.
            let columns = cx.b.shape(b)[1];
            let all = product(cx, a, b, plain(vec![], vec![], 2, 0))?;
            let mask = group_mask(cx, offs, columns)?;
            let mask = cx.b.transpose(mask, &[1, 0])?;
            let mine = masked(cx, all, mask, &[0, 2])?;
            cx.b.reduce_by(mine, &[0], BinaryOp::Add)?
        }
        (ra, rb, offs) => {
            return err(format!(
                "_grouped_mm of a {ra}-d and a {rb}-d tensor {} offsets: tpuc lowers 2-d x 3-d, \
                 2-d x 2-d and 3-d x 2-d with offsets and 3-d x 3-d without",
                if offs.is_some() { "with" } else { "without" }
            ))
        }
    };
    let y = match cx.opt_tensor(n, "bias")? {
        Some(bias) => {
            let shape = cx.b.shape(y).to_vec();
            let bias = cx.b.convert(bias, acc);
            let rank = cx.b.ty(bias).rank();
            let dims: Vec<i64> = (shape.len() - rank..shape.len())
                .map(|d| d as i64)
                .collect();
            let bias = cx.b.broadcast_in_dim(bias, &shape, &dims)?;
            cx.b.binary(BinaryOp::Add, y, bias)?
        }
        None => y,
    };
    Ok(vec![Some(cx.b.convert(y, elem))])
}

fn matmul(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let a = cx.tensor(n, "self")?;
    let b = cx.tensor(n, "other")?;
    Ok(vec![Some(matmul_general(cx, a, b)?)])
}

/// What an attention computes beyond its inputs.
#[derive(Clone, Copy)]
struct Attention {
    scale: f64,
    causal: bool,
    /// Keys and values may have fewer heads than the query (grouped-query attention).
    grouped: bool,
    /// The log-sum-exp of each row of scores is a second result, of this type.
    lse: Option<DType>,
}

/// The factor an attention node scales its scores by: its `scale`, else one over the root of the
/// query's last dimension (torch's default).
pub(super) fn attention_scale(cx: &Ctx, n: &Node) -> OpResult<f64> {
    let q = cx.tensor(n, "query")?;
    let head_dim = cx.b.shape(q).last().copied().unwrap_or(1);
    Ok(cx
        .opt_float(n, "scale")?
        .unwrap_or(1.0 / (head_dim as f64).sqrt()))
}

/// `scaled_dot_product_attention` and torch's fused kernels of it (with the fusion stage on, one
/// `tpuc.attention` composite: `lower::composites`).
fn sdpa(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    if cx.float(n, "dropout_p", Some(0.0))? != 0.0 {
        return err(
            "not supported: scaled_dot_product_attention with dropout_p > 0 (inference only)",
        );
    }
    let (q, k, v) = (
        cx.tensor(n, "query")?,
        cx.tensor(n, "key")?,
        cx.tensor(n, "value")?,
    );
    let qs = cx.b.shape(q).to_vec();
    if qs.len() < 2 {
        return err("query must have at least 2 dimensions");
    }
    // Grouped-query attention: each key/value head serves heads/kv_heads consecutive query
    // heads (torch's `enable_gqa`). The CPU flash kernel takes such keys and values without
    // the flag: torch's `enable_gqa=True` on CPU tensors arrives as that kernel.
    let spec = Attention {
        scale: attention_scale(cx, n)?,
        causal: cx.bool(n, "is_causal", false)?,
        grouped: cx.bool(n, "enable_gqa", false)? || n.target.contains("flash_attention"),
        lse: if n.target.contains("flash_attention") {
            cx.opt_out_type(n, 1)?.map(|t| t.elem)
        } else {
            None
        },
    };
    let mask = cx.opt_tensor(n, "attn_mask")?;
    let results = attention(cx, q, k, v, mask, spec, n)?;
    let mut outs: Vec<Option<Value>> = results.into_iter().map(Some).collect();
    if n.target.contains("flash_attention") && outs.len() == 1 {
        outs.push(None);
    }
    Ok(outs)
}

/// Attention of `q` over `k` and `v` (and `mask`: boolean, keep; else added to the scores):
/// the output, and the log-sum-exp of each row when `spec.lse` asks. Keys of the node `n` padded
/// to a bucket are hidden from every query.
fn attention(
    cx: &mut Ctx,
    q: Value,
    k: Value,
    v: Value,
    mask: Option<Value>,
    spec: Attention,
    n: &Node,
) -> OpResult<Vec<Value>> {
    // 16-bit inputs are computed in float32 and the output rounded once, as torch's kernels do.
    let mut qkv = [q, k, v];
    let narrow = widened(cx, &mut qkv);
    let [q, mut k, mut v] = qkv;
    let qs = cx.b.shape(q).to_vec();
    let rank = qs.len();
    let l = qs[rank - 2];
    if spec.grouped && rank >= 3 {
        let heads = qs[rank - 3];
        for t in [&mut k, &mut v] {
            let s = cx.b.shape(*t).to_vec();
            if s.len() != rank {
                return err(format!(
                    "key and value must have the rank of the query ({rank}), got {s:?}"
                ));
            }
            let kv = s[rank - 3];
            if kv != heads {
                if kv < 1 || heads % kv != 0 {
                    return err(format!(
                        "grouped-query attention needs the query heads ({heads}) to be a \
                         multiple of the key/value heads ({kv})"
                    ));
                }
                let mut unsq = s.clone();
                unsq.insert(rank - 2, 1);
                let mut wide = s.clone();
                wide.insert(rank - 2, heads / kv);
                let u = cx.b.reshape(*t, &unsq)?;
                let dims: Vec<i64> = (0..unsq.len() as i64).collect();
                let b = cx.b.broadcast_in_dim(u, &wide, &dims)?;
                let mut out = s;
                out[rank - 3] = heads;
                *t = cx.b.reshape(b, &out)?;
            }
        }
    }
    let ks = cx.b.shape(k).to_vec();
    let s_len = ks[rank - 2];
    let mut perm: Vec<i64> = (0..rank as i64).collect();
    perm.swap(rank - 1, rank - 2);
    let kt = cx.b.transpose(k, &perm)?;
    // Broadcast batch dims of q against k (e.g. a mask or a shared key).
    let scores = matmul_general(cx, q, kt)?;
    let mut scores = cx.scaled(scores, spec.scale)?;
    let shape = cx.b.shape(scores).to_vec();
    let elem = cx.b.elem(scores);
    if spec.causal {
        let rows = cx.b.iota(TensorType::new(vec![l, s_len], DType::I64), 0)?;
        let cols = cx.b.iota(TensorType::new(vec![l, s_len], DType::I64), 1)?;
        let keep = cx.b.compare(CompareDir::Ge, rows, cols)?;
        let keep = cx.b.broadcast_to(keep, &shape)?;
        let ninf =
            cx.b.splat(&TensorType::new(shape.clone(), elem), f64::NEG_INFINITY);
        scores = cx.b.select(keep, scores, ninf)?;
    }
    // Keys padded to a bucket (`padding.rs`) are hidden from every query.
    if let Some(keep) = cx.padded_keys(n, rank - 2, &shape)? {
        let ninf =
            cx.b.splat(&TensorType::new(shape.clone(), elem), f64::NEG_INFINITY);
        scores = cx.b.select(keep, scores, ninf)?;
    }
    if let Some(mask) = mask {
        let mask = cx.b.broadcast_to(mask, &shape)?;
        if cx.b.elem(mask).is_bool() {
            let ninf =
                cx.b.splat(&TensorType::new(shape.clone(), elem), f64::NEG_INFINITY);
            scores = cx.b.select(mask, scores, ninf)?;
        } else {
            scores = arith(
                cx,
                Operand::Tensor(scores),
                Operand::Tensor(mask),
                BinaryOp::Add,
            )?;
        }
    }
    // Softmax as the fused kernel computes it: exponentials of the scores less the row maximum,
    // multiplied with the values, then divided by the row sum.
    let last = rank as i64 - 1;
    let kept: Vec<i64> = (0..last).collect();
    let (max, _, mut exp) = shifted_exp(cx, scores, rank - 1)?;
    // A row the mask hides entirely attends to nothing: zeros, and a log-sum-exp of 0, as
    // torch's kernels give (a causal mask alone always keeps the first column).
    let hidden = if mask.is_some() {
        let ninf = cx.full_like(max, f64::NEG_INFINITY, None);
        let hidden = cx.b.compare(CompareDir::Eq, max, ninf)?;
        let hidden_b = cx.b.broadcast_in_dim(hidden, &shape, &kept)?;
        let zeros = cx.full_like(exp, 0.0, None);
        exp = cx.b.select(hidden_b, zeros, exp)?;
        Some(hidden)
    } else {
        None
    };
    let mut sum = cx.b.reduce_by(exp, &[last], BinaryOp::Add)?;
    if let Some(hidden) = hidden {
        let ones = cx.full_like(sum, 1.0, None);
        sum = cx.b.select(hidden, ones, sum)?;
    }
    let weighted = matmul_general(cx, exp, v)?;
    let out_shape = cx.b.shape(weighted).to_vec();
    let sum_b = cx.b.broadcast_in_dim(sum, &out_shape, &kept)?;
    let out = cx.b.binary(BinaryOp::Div, weighted, sum_b)?;
    let out = narrowed(cx, out, narrow);
    // The fused CPU kernel also returns the log-sum-exp of each row of scores (for backward),
    // in float32 for 16-bit inputs.
    let Some(lse_elem) = spec.lse else {
        return Ok(vec![out]);
    };
    let log = cx.b.unary(UnaryOp::Log, sum)?;
    let mut lse = cx.b.binary(BinaryOp::Add, log, max)?;
    if let Some(hidden) = hidden {
        let zeros = cx.full_like(lse, 0.0, None);
        lse = cx.b.select(hidden, zeros, lse)?;
    }
    Ok(vec![out, cx.b.convert(lse, lse_elem)])
}

/// `_trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim)`: each input with size-1
/// dimensions inserted at its `expand` positions, the three multiplied (broadcast) and summed
/// over `sumdim` (torch's bilinear layer is made of it). In torch's two steps, each rounded to
/// the output's type: i1 i2 summed over the dimensions i3 lacks, then that times i3 summed
/// over the rest.
fn trilinear(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let out = cx.out_type(n, 0)?;
    let acc = out.elem.accumulation();
    let mut expanded = Vec::with_capacity(3);
    for (input, expand) in [("i1", "expand1"), ("i2", "expand2"), ("i3", "expand3")] {
        let x = cx.tensor(n, input)?;
        let mut shape = cx.b.shape(x).to_vec();
        for d in cx.ints(n, expand, None)? {
            let d = norm_dim(d, shape.len() + 1)?;
            shape.insert(d, 1);
        }
        let x = cx.b.convert(x, acc);
        expanded.push(cx.b.reshape(x, &shape)?);
    }
    let rank = cx.b.ty(expanded[0]).rank();
    let sumdim = cx
        .ints(n, "sumdim", None)?
        .into_iter()
        .map(|d| norm_dim(d, rank))
        .collect::<OpResult<Vec<usize>>>()?;
    let third = cx.b.shape(expanded[2]).to_vec();
    let (first, second): (Vec<usize>, Vec<usize>) =
        sumdim.iter().partition(|&&d| third.get(d) == Some(&1));
    let pair = cx.broadcast_all(&expanded[..2])?;
    let product = cx.b.binary(BinaryOp::Mul, pair[0], pair[1])?;
    let partial = sum_keeping(cx, product, &first)?;
    let partial = cx.rounded_to(partial, out.elem);
    let v = cx.broadcast_all(&[partial, expanded[2]])?;
    let product = cx.b.binary(BinaryOp::Mul, v[0], v[1])?;
    let summed = sum_keeping(cx, product, &second)?;
    let summed = cx.b.reshape(summed, &out.shape)?;
    Ok(vec![Some(cx.b.convert(summed, out.elem))])
}

/// `x` summed over `dims`, which stay as size-1 dimensions.
fn sum_keeping(cx: &mut Ctx, x: Value, dims: &[usize]) -> OpResult<Value> {
    if dims.is_empty() {
        return Ok(x);
    }
    let mut shape = cx.b.shape(x).to_vec();
    let dims_i: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
    let summed = cx.b.reduce_by(x, &dims_i, BinaryOp::Add)?;
    for &d in dims {
        shape[d] = 1;
    }
    Ok(cx.b.reshape(summed, &shape)?)
}

pub fn register(r: &mut Registry) {
    r.add(&["aten._trilinear.default"], trilinear);
    r.add(&["aten.linear.default"], linear);
    r.add(&["aten.addmm.default"], |cx, n| {
        add_product(cx, n, ["mat1", "mat2"], |ra, _| contract_last(0, ra, 0))
    });
    r.add(&["aten.addmv.default"], |cx, n| {
        add_product(cx, n, ["mat", "vec"], |ra, _| contract_last(0, ra, 0))
    });
    r.add(&["aten.baddbmm.default"], |cx, n| {
        add_product(cx, n, ["batch1", "batch2"], |ra, _| contract_last(1, ra, 1))
    });
    r.add(&["aten.addbmm.default"], addbmm);
    r.add(&["aten.mm.default", "aten.bmm.default"], mm);
    r.add(&["aten.matmul.default"], matmul);
    r.add(&["aten._grouped_mm.default"], grouped_mm);
    r.add(
        &[
            "aten.scaled_dot_product_attention.default",
            "aten._scaled_dot_product_flash_attention_for_cpu.default",
        ],
        sdpa,
    );
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_checks, t, TestGraph};
    use tpuc_fx::DType;

    fn flash(kv_heads: i64) -> TestGraph {
        let mut g = TestGraph::default();
        let q = g.input("q", DType::F32, &[1, 4, 3, 8]);
        let k = g.input("k", DType::F32, &[1, kv_heads, 5, 8]);
        let v = g.input("v", DType::F32, &[1, kv_heads, 5, 8]);
        g.node(
            "aten._scaled_dot_product_flash_attention_for_cpu.default",
            vec![("query", t(&q)), ("key", t(&k)), ("value", t(&v))],
            &[(DType::F32, &[1, 4, 3, 8]), (DType::F32, &[1, 4, 3])],
        );
        g
    }

    #[test]
    fn grouped_query_attention_shares_each_key_head_among_its_group() {
        // Two key/value heads for four query heads: each is broadcast to the two query heads
        // of its group (heads 0 and 1 read key head 0), then the product is per head.
        let text = flash(2).text(&["n0_0", "n0_1"]);
        assert_checks(
            &text,
            &[
                "stablehlo.reshape %1 shape=[1, 2, 1, 5, 8]",
                "stablehlo.broadcast_in_dim %3 dims=[0, 1, 2, 3, 4] shape=[1, 2, 2, 5, 8]",
                "stablehlo.reshape %4 shape=[1, 4, 5, 8]",
                "stablehlo.dot_general %0, %9 batch=[0, 1]x[0, 1]",
            ],
        );
        let e = flash(3).lower(&["n0_0"]).unwrap_err().to_string();
        assert!(
            e.contains("query heads (4) to be a multiple of the key/value heads (3)"),
            "{e}"
        );
    }
}
