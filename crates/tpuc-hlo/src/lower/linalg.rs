//! Linear algebra over batches of matrices (the last two dimensions), real floats:
//!
//! - Cholesky factors and triangular solves are StableHLO ops; solves with a Cholesky factor
//!   are two triangular solves.
//! - LU with partial pivoting (LAPACK's getrf: the largest magnitude in the column, the first
//!   on ties; a zero pivot is recorded in `info` and its column left unscaled) is unrolled
//!   over the columns, each step a row swap by masks and a rank-one update: determinants,
//!   log-determinants, inverses and solves are built on it.
//! - Symmetric eigendecompositions and QR are calls XLA expands itself (`Eigh`: Jacobi
//!   sweeps; `Qr` and `ProductOfElementaryHouseholderReflectors`: Householder reflections in
//!   LAPACK's compact form); the SVD is the eigendecomposition of [[0, A], [A^T, 0]], whose
//!   eigenvalues are the singular values and their negatives (no squared condition number).
//!
//! Eigenvectors and singular vectors are each defined up to sign: tpuc's may differ in sign
//! from LAPACK's.

use tpuc_fx::Node;

use super::prelude::*;
use super::reduction::arg_reduce;

/// A batch of matrices: (batch shape, rows, columns).
fn matrices(cx: &Ctx, x: Value, what: &str) -> OpResult<(Vec<i64>, i64, i64)> {
    let ty = cx.b.ty(x);
    let r = ty.rank();
    if r < 2 {
        return err(format!(
            "{what} needs matrices (at least 2 dimensions), got {ty}"
        ));
    }
    if !matches!(ty.elem, DType::F32 | DType::F64) {
        return err(format!(
            "not supported: {what} of {} (tpuc's linear algebra takes float32 and float64)",
            ty.elem
        ));
    }
    Ok((ty.shape[..r - 2].to_vec(), ty.shape[r - 2], ty.shape[r - 1]))
}

fn square(cx: &Ctx, x: Value, what: &str) -> OpResult<(Vec<i64>, i64)> {
    let (batch, m, n) = matrices(cx, x, what)?;
    if m != n {
        return err(format!("{what} needs square matrices, got {}", cx.b.ty(x)));
    }
    Ok((batch, n))
}

/// The matrix input, named `A` in torch.linalg's ops and `self` in the older ones.
fn matrix_input(cx: &Ctx, n: &Node) -> OpResult<Value> {
    let name = if n.arg("A").is_some() { "A" } else { "self" };
    cx.tensor(n, name)
}

/// The first `count` outputs of a lowering: the public op returns fewer than the
/// implementation op it is written for (`linalg_det` returns `_linalg_det`'s determinant).
fn leading(count: usize, outputs: OpResult<Vec<Option<Value>>>) -> OpResult<Vec<Option<Value>>> {
    let mut outputs = outputs?;
    outputs.truncate(count);
    Ok(outputs)
}

fn with(batch: &[i64], tail: &[i64]) -> Vec<i64> {
    let mut s = batch.to_vec();
    s.extend_from_slice(tail);
    s
}

/// Row and column indices of `shape`'s last two dimensions (i64, broadcast to `shape`).
fn positions(cx: &mut Ctx, shape: &[i64]) -> OpResult<(Value, Value)> {
    let r = shape.len() as i64;
    let ty = TensorType::new(shape.to_vec(), DType::I64);
    Ok((cx.b.iota(ty.clone(), r - 2)?, cx.b.iota(ty, r - 1)?))
}

/// `col - row` compared with `k`: the mask of the triangle on or below (`lower`) or on or
/// above the `k`-th diagonal.
fn triangle(cx: &mut Ctx, shape: &[i64], k: i64, lower: bool) -> OpResult<Value> {
    let (rows, cols) = positions(cx, shape)?;
    let offset = cx.b.binary(BinaryOp::Sub, cols, rows)?;
    let k = cx.full_like(offset, k as f64, None);
    let dir = if lower {
        CompareDir::Le
    } else {
        CompareDir::Ge
    };
    Ok(cx.b.compare(dir, offset, k)?)
}

fn keep(cx: &mut Ctx, mask: Value, x: Value) -> OpResult<Value> {
    let zero = cx.full_like(x, 0.0, None);
    Ok(cx.b.select(mask, x, zero)?)
}

fn identity(cx: &mut Ctx, batch: &[i64], n: i64, elem: DType) -> OpResult<Value> {
    let shape = with(batch, &[n, n]);
    let (rows, cols) = positions(cx, &shape)?;
    let eq = cx.b.compare(CompareDir::Eq, rows, cols)?;
    Ok(cx.b.convert(eq, elem))
}

/// The diagonals [..., min(m, n)] of a batch of matrices.
fn diagonal_of(cx: &mut Ctx, x: Value) -> OpResult<Value> {
    let shape = cx.b.shape(x).to_vec();
    let r = shape.len();
    let (rows, cols) = positions(cx, &shape)?;
    let eq = cx.b.compare(CompareDir::Eq, rows, cols)?;
    let on = keep(cx, eq, x)?;
    let k = shape[r - 2].min(shape[r - 1]);
    let on = cx.b.slice_dim(on, r - 2, 0, k, 1)?;
    let on = cx.b.slice_dim(on, r - 1, 0, k, 1)?;
    Ok(cx.b.reduce_by(on, &[r as i64 - 1], BinaryOp::Add)?)
}

fn transposed(cx: &mut Ctx, x: Value) -> OpResult<Value> {
    let r = cx.b.ty(x).rank();
    let mut perm: Vec<i64> = (0..r as i64).collect();
    perm.swap(r - 2, r - 1);
    Ok(cx.b.transpose(x, &perm)?)
}

fn matmul(cx: &mut Ctx, a: Value, b: Value) -> OpResult<Value> {
    super::linear::batched_matmul(cx, a, b)
}

/// Broadcasts the batch dimensions of two matrix stacks to their common shape.
fn common_batch(cx: &mut Ctx, a: Value, b: Value) -> OpResult<(Value, Value)> {
    let (sa, sb) = (cx.b.shape(a).to_vec(), cx.b.shape(b).to_vec());
    let (ra, rb) = (sa.len(), sb.len());
    let Some(batch) = broadcast_shapes(&sa[..ra - 2], &sb[..rb - 2]) else {
        return err(format!(
            "batch dimensions {:?} and {:?} do not broadcast",
            &sa[..ra - 2],
            &sb[..rb - 2]
        ));
    };
    let a = cx.b.broadcast_to(a, &with(&batch, &sa[ra - 2..]))?;
    let b = cx.b.broadcast_to(b, &with(&batch, &sb[rb - 2..]))?;
    Ok((a, b))
}

fn solve_triangular(
    cx: &mut Ctx,
    a: Value,
    b: Value,
    left: bool,
    lower: bool,
    unit: bool,
    transpose: TriangularTranspose,
) -> OpResult<Value> {
    Ok(cx.b.op1(
        OpKind::TriangularSolve {
            left_side: left,
            lower,
            unit_diagonal: unit,
            transpose,
        },
        &[a, b],
    )?)
}

// ----- Cholesky --------------------------------------------------------------------------

/// The Cholesky factor with its other triangle zeroed (XLA's blocked algorithm; NaN where the
/// matrix is not positive definite).
fn cholesky(cx: &mut Ctx, a: Value, upper: bool) -> OpResult<Value> {
    let shape = cx.b.shape(a).to_vec();
    let factor = cx.b.op1(OpKind::Cholesky { lower: !upper }, &[a])?;
    let mask = triangle(cx, &shape, 0, !upper)?;
    keep(cx, mask, factor)
}

/// LAPACK's `info` of a Cholesky factorisation: 0, or the order of the first leading minor
/// that is not positive definite, found by eliminating column after column (the pivots are
/// the Schur complements' diagonals) as potrf does, since XLA's factor turns NaN as a whole.
fn cholesky_info(cx: &mut Ctx, a: Value, upper: bool) -> OpResult<Value> {
    let (batch, n) = square(cx, a, "cholesky")?;
    let shape = cx.b.shape(a).to_vec();
    let r = shape.len();
    let (rows, cols) = positions(cx, &shape)?;
    let mut s = symmetrized(cx, a, !upper)?;
    let mut info = cx.b.splat(&TensorType::new(batch.clone(), DType::I32), 0.0);
    for k in 0..n {
        let d = cx.b.slice_dim(s, r - 2, k, k + 1, 1)?;
        let d = cx.b.slice_dim(d, r - 1, k, k + 1, 1)?;
        let zero = cx.full_like(d, 0.0, None);
        let positive = cx.b.compare(CompareDir::Gt, d, zero)?;
        let one = cx.full_like(d, 1.0, None);
        let divisor = cx.b.select(positive, d, one)?;
        let failed = cx.b.unary(UnaryOp::Not, positive)?;
        let failed = cx.b.reshape(failed, &batch)?;
        let unset = cx.full_like(info, 0.0, None);
        let first = cx.b.compare(CompareDir::Eq, info, unset)?;
        let record = cx.b.binary(BinaryOp::And, failed, first)?;
        let order = cx.full_like(info, (k + 1) as f64, None);
        info = cx.b.select(record, order, info)?;
        if k + 1 == n {
            break;
        }
        let column = cx.b.slice_dim(s, r - 1, k, k + 1, 1)?;
        let row = cx.b.slice_dim(s, r - 2, k, k + 1, 1)?;
        let divisor = cx.b.broadcast_to(divisor, &shape)?;
        let column = cx.b.broadcast_to(column, &shape)?;
        let row = cx.b.broadcast_to(row, &shape)?;
        let outer = cx.b.binary(BinaryOp::Mul, column, row)?;
        let update = cx.b.binary(BinaryOp::Div, outer, divisor)?;
        let kv = cx.full_like(rows, k as f64, None);
        let below = cx.b.compare(CompareDir::Gt, rows, kv)?;
        let right = cx.b.compare(CompareDir::Gt, cols, kv)?;
        let trailing = cx.b.binary(BinaryOp::And, below, right)?;
        let reduced = cx.b.binary(BinaryOp::Sub, s, update)?;
        s = cx.b.select(trailing, reduced, s)?;
    }
    Ok(info)
}

fn linalg_cholesky_ex(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let a = cx.tensor(n, "self")?;
    square(cx, a, "cholesky")?;
    let upper = cx.bool(n, "upper", false)?;
    let factor = cholesky(cx, a, upper)?;
    // The elimination for info only where the graph reads it (torch.linalg.cholesky's check).
    let info_used = output_slots(n)
        .get(1)
        .copied()
        .flatten()
        .is_some_and(|t| cx.is_used(t));
    let info = if info_used {
        Some(cholesky_info(cx, a, upper)?)
    } else {
        None
    };
    Ok(vec![Some(factor), info])
}

/// Solves A X = B given A's Cholesky factor: L Y = B, then L^T X = Y (U^T Y = B, U X = Y).
fn solve_with_factor(cx: &mut Ctx, factor: Value, b: Value, upper: bool) -> OpResult<Value> {
    let (first, second) = if upper {
        (TriangularTranspose::Transpose, TriangularTranspose::No)
    } else {
        (TriangularTranspose::No, TriangularTranspose::Transpose)
    };
    let y = solve_triangular(cx, factor, b, true, !upper, false, first)?;
    solve_triangular(cx, factor, y, true, !upper, false, second)
}

fn cholesky_solve(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let b = cx.tensor(n, "self")?;
    let factor = cx.tensor(n, "input2")?;
    square(cx, factor, "cholesky_solve")?;
    matrices(cx, b, "cholesky_solve")?;
    let upper = cx.bool(n, "upper", false)?;
    let (factor, b) = common_batch(cx, factor, b)?;
    Ok(vec![Some(solve_with_factor(cx, factor, b, upper)?)])
}

fn cholesky_inverse(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let factor = cx.tensor(n, "self")?;
    let (batch, size) = square(cx, factor, "cholesky_inverse")?;
    let upper = cx.bool(n, "upper", false)?;
    let eye = identity(cx, &batch, size, cx.b.elem(factor))?;
    Ok(vec![Some(solve_with_factor(cx, factor, eye, upper)?)])
}

// ----- Triangular solves -----------------------------------------------------------------

fn linalg_solve_triangular(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let a = cx.tensor(n, "self")?;
    let b = cx.tensor(n, "B")?;
    square(cx, a, "solve_triangular")?;
    matrices(cx, b, "solve_triangular")?;
    let upper = cx.bool(n, "upper", false)?;
    let left = cx.bool(n, "left", true)?;
    let unit = cx.bool(n, "unitriangular", false)?;
    let (a, b) = common_batch(cx, a, b)?;
    let x = solve_triangular(cx, a, b, left, !upper, unit, TriangularTranspose::No)?;
    Ok(vec![Some(x)])
}

/// The old `triangular_solve(b, A, upper, transpose, unitriangular)`: (X, a copy of A).
fn triangular_solve(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let b = cx.tensor(n, "self")?;
    let a = cx.tensor(n, "A")?;
    square(cx, a, "triangular_solve")?;
    matrices(cx, b, "triangular_solve")?;
    let upper = cx.bool(n, "upper", true)?;
    let transpose = if cx.bool(n, "transpose", false)? {
        TriangularTranspose::Transpose
    } else {
        TriangularTranspose::No
    };
    let unit = cx.bool(n, "unitriangular", false)?;
    let (a, b) = common_batch(cx, a, b)?;
    let x = solve_triangular(cx, a, b, true, !upper, unit, transpose)?;
    Ok(vec![Some(x), Some(a)])
}

// ----- LU with partial pivoting ------------------------------------------------------------

/// An LU factorisation: the packed factors (L's unit diagonal implied), the row each step
/// swapped in (0-based, [..., min(m, n)]), the resulting order of the rows ([..., m]: row i of
/// L U is row `order[i]` of A) and `info` (0, or the 1-based step of the first zero pivot).
struct Lu {
    packed: Value,
    swaps: Value,
    order: Value,
    info: Value,
}

/// Swaps rows `k` and `p` (a per-matrix index, [..., 1, 1]) of each matrix in `x`.
fn swap_rows(cx: &mut Ctx, x: Value, k: i64, p: Value) -> OpResult<Value> {
    let shape = cx.b.shape(x).to_vec();
    let r = shape.len();
    let (rows, _) = positions(cx, &shape)?;
    let p = cx.b.broadcast_to(p, &shape)?;
    let at_p = cx.b.compare(CompareDir::Eq, rows, p)?;
    let row_p = keep(cx, at_p, x)?;
    let row_p = cx.b.reduce_by(row_p, &[r as i64 - 2], BinaryOp::Add)?;
    let mut one_row = shape.clone();
    one_row[r - 2] = 1;
    let row_p = cx.b.reshape(row_p, &one_row)?;
    let row_p = cx.b.broadcast_to(row_p, &shape)?;
    let row_k = cx.b.slice_dim(x, r - 2, k, k + 1, 1)?;
    let row_k = cx.b.broadcast_to(row_k, &shape)?;
    let k_value = cx.full_like(rows, k as f64, None);
    let at_k = cx.b.compare(CompareDir::Eq, rows, k_value)?;
    let x = cx.b.select(at_p, row_k, x)?;
    Ok(cx.b.select(at_k, row_p, x)?)
}

fn lu(cx: &mut Ctx, a: Value) -> OpResult<Lu> {
    let (batch, m, n) = matrices(cx, a, "lu")?;
    let shape = cx.b.shape(a).to_vec();
    let r = shape.len();
    let steps = m.min(n);
    let (rows, cols) = positions(cx, &shape)?;
    let mut x = a;
    let mut order = cx.b.iota(
        TensorType::new(with(&batch, &[m, 1]), DType::I64),
        r as i64 - 2,
    )?;
    let mut swaps = Vec::with_capacity(steps as usize);
    let mut info = cx.b.splat(&TensorType::new(batch.clone(), DType::I32), 0.0);
    for k in 0..steps {
        // The pivot: the largest magnitude in column k at or below row k.
        let column = cx.b.slice_dim(x, r - 1, k, k + 1, 1)?;
        let column = cx.b.reshape(column, &with(&batch, &[m]))?;
        let magnitude = cx.b.unary(UnaryOp::Abs, column)?;
        let row_index = cx.b.iota(
            TensorType::new(with(&batch, &[m]), DType::I64),
            r as i64 - 2,
        )?;
        let kv = cx.full_like(row_index, k as f64, None);
        let below = cx.b.compare(CompareDir::Ge, row_index, kv)?;
        let minus_one = cx.full_like(magnitude, -1.0, None);
        let candidates = cx.b.select(below, magnitude, minus_one)?;
        let (_, p) = arg_reduce(cx, candidates, r - 2, true)?;
        swaps.push(cx.b.reshape(p, &with(&batch, &[1]))?);
        let p = cx.b.reshape(p, &with(&batch, &[1, 1]))?;
        x = swap_rows(cx, x, k, p)?;
        order = swap_rows(cx, order, k, p)?;
        // Eliminate below the pivot: l = column / pivot (0 for a zero pivot), then subtract
        // l times the pivot row from the rows below, right of column k.
        let pivot = cx.b.slice_dim(x, r - 2, k, k + 1, 1)?;
        let pivot = cx.b.slice_dim(pivot, r - 1, k, k + 1, 1)?;
        let zero = cx.full_like(pivot, 0.0, None);
        let singular = cx.b.compare(CompareDir::Eq, pivot, zero)?;
        let one = cx.full_like(pivot, 1.0, None);
        let divisor = cx.b.select(singular, one, pivot)?;
        let column = cx.b.slice_dim(x, r - 1, k, k + 1, 1)?;
        let divisor_b =
            cx.b.broadcast_to(divisor, cx.b.shape(column).to_vec().as_slice())?;
        let l = cx.b.binary(BinaryOp::Div, column, divisor_b)?;
        let singular_b =
            cx.b.broadcast_to(singular, cx.b.shape(l).to_vec().as_slice())?;
        let zeros = cx.full_like(l, 0.0, None);
        let l = cx.b.select(singular_b, zeros, l)?;
        let pivot_row = cx.b.slice_dim(x, r - 2, k, k + 1, 1)?;
        let l_full = cx.b.broadcast_to(l, &shape)?;
        let row_full = cx.b.broadcast_to(pivot_row, &shape)?;
        let update = cx.b.binary(BinaryOp::Mul, l_full, row_full)?;
        let kv = cx.full_like(rows, k as f64, None);
        let lower_rows = cx.b.compare(CompareDir::Gt, rows, kv)?;
        let right_cols = cx.b.compare(CompareDir::Gt, cols, kv)?;
        let at_col = cx.b.compare(CompareDir::Eq, cols, kv)?;
        let trailing = cx.b.binary(BinaryOp::And, lower_rows, right_cols)?;
        let reduced = cx.b.binary(BinaryOp::Sub, x, update)?;
        x = cx.b.select(trailing, reduced, x)?;
        let multipliers = cx.b.binary(BinaryOp::And, lower_rows, at_col)?;
        x = cx.b.select(multipliers, l_full, x)?;
        // info: the first zero pivot's step, 1-based.
        let singular = cx.b.reshape(singular, &batch)?;
        let unset = cx.full_like(info, 0.0, None);
        let first = cx.b.compare(CompareDir::Eq, info, unset)?;
        let record = cx.b.binary(BinaryOp::And, singular, first)?;
        let step = cx.full_like(info, (k + 1) as f64, None);
        info = cx.b.select(record, step, info)?;
    }
    let swaps = if swaps.is_empty() {
        cx.b.splat(&TensorType::new(with(&batch, &[0]), DType::I64), 0.0)
    } else {
        cx.b.concatenate(&swaps, r as i64 - 2)?
    };
    let order = cx.b.reshape(order, &with(&batch, &[m]))?;
    Ok(Lu {
        packed: x,
        swaps,
        order,
        info,
    })
}

/// LAPACK's 1-based pivots (int32) from 0-based swaps.
fn lapack_pivots(cx: &mut Ctx, swaps: Value) -> OpResult<Value> {
    let one = cx.full_like(swaps, 1.0, None);
    let p = cx.b.binary(BinaryOp::Add, swaps, one)?;
    Ok(cx.b.convert(p, DType::I32))
}

/// The permutation matrix P with A = P L U: P[order[i], i] = 1.
fn permutation_matrix(cx: &mut Ctx, order: Value, elem: DType) -> OpResult<Value> {
    let shape = cx.b.shape(order).to_vec();
    let r = shape.len();
    let m = shape[r - 1];
    let full = with(&shape[..r - 1], &[m, m]);
    let (rows, _) = positions(cx, &full)?;
    let dims: Vec<i64> = (0..r as i64 - 1).chain([r as i64]).collect();
    let order = cx.b.broadcast_in_dim(order, &full, &dims)?;
    let eq = cx.b.compare(CompareDir::Eq, rows, order)?;
    Ok(cx.b.convert(eq, elem))
}

/// L ([..., m, k], unit lower) and U ([..., k, n]) from packed factors.
fn unpacked(cx: &mut Ctx, packed: Value) -> OpResult<(Value, Value)> {
    let shape = cx.b.shape(packed).to_vec();
    let r = shape.len();
    let (m, n) = (shape[r - 2], shape[r - 1]);
    let k = m.min(n);
    let strictly_lower = triangle(cx, &shape, -1, true)?;
    let l = keep(cx, strictly_lower, packed)?;
    let l = cx.b.slice_dim(l, r - 1, 0, k, 1)?;
    let l_shape = cx.b.shape(l).to_vec();
    let (rows, cols) = positions(cx, &l_shape)?;
    let diag = cx.b.compare(CompareDir::Eq, rows, cols)?;
    let one = cx.full_like(l, 1.0, None);
    let l = cx.b.select(diag, one, l)?;
    let upper = triangle(cx, &shape, 0, false)?;
    let u = keep(cx, upper, packed)?;
    let u = cx.b.slice_dim(u, r - 2, 0, k, 1)?;
    Ok((l, u))
}

fn refuse_unpivoted(cx: &Ctx, n: &Node) -> OpResult<()> {
    if !cx.bool(n, "pivot", true)? {
        return err(
            "not supported: LU without pivoting (pivot=False; torch's CPU kernels refuse it too)",
        );
    }
    Ok(())
}

fn linalg_lu_factor_ex(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    refuse_unpivoted(cx, n)?;
    let a = matrix_input(cx, n)?;
    let f = lu(cx, a)?;
    let pivots = lapack_pivots(cx, f.swaps)?;
    Ok(vec![Some(f.packed), Some(pivots), Some(f.info)])
}

fn linalg_lu(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    refuse_unpivoted(cx, n)?;
    let a = cx.tensor(n, "A")?;
    let f = lu(cx, a)?;
    let p = permutation_matrix(cx, f.order, cx.b.elem(a))?;
    let (l, u) = unpacked(cx, f.packed)?;
    Ok(vec![Some(p), Some(l), Some(u)])
}

/// The row order LAPACK's 1-based pivots (data) describe: the swaps applied in turn.
fn order_from_pivots(cx: &mut Ctx, pivots: Value, m: i64) -> OpResult<Value> {
    let shape = cx.b.shape(pivots).to_vec();
    let r = shape.len();
    let batch = shape[..r - 1].to_vec();
    let steps = shape[r - 1];
    let mut order = cx.b.iota(
        TensorType::new(with(&batch, &[m, 1]), DType::I64),
        r as i64 - 1,
    )?;
    let pivots = cx.b.convert(pivots, DType::I64);
    for k in 0..steps {
        let p = cx.b.slice_dim(pivots, r - 1, k, k + 1, 1)?;
        let one = cx.full_like(p, 1.0, None);
        let p = cx.b.binary(BinaryOp::Sub, p, one)?;
        let p = cx.b.reshape(p, &with(&batch, &[1, 1]))?;
        order = swap_rows(cx, order, k, p)?;
    }
    Ok(cx.b.reshape(order, &with(&batch, &[m]))?)
}

fn lu_unpack(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let packed = cx.tensor(n, "LU_data")?;
    let pivots = cx.tensor(n, "LU_pivots")?;
    let (_, m, _) = matrices(cx, packed, "lu_unpack")?;
    let elem = cx.b.elem(packed);
    let mut out = vec![None, None, None];
    if cx.bool(n, "unpack_pivots", true)? {
        let order = order_from_pivots(cx, pivots, m)?;
        out[0] = Some(permutation_matrix(cx, order, elem)?);
    }
    if cx.bool(n, "unpack_data", true)? {
        let (l, u) = unpacked(cx, packed)?;
        out[1] = Some(l);
        out[2] = Some(u);
    }
    Ok(out)
}

/// Rows of `b` in `order` (row i of the result is row order[i] of b).
fn rows_in_order(cx: &mut Ctx, b: Value, order: Value) -> OpResult<Value> {
    let p = permutation_matrix(cx, order, cx.b.elem(b))?;
    // P^T B, written as a selection rather than a product so that infinities stay put.
    let shape = cx.b.shape(b).to_vec();
    let r = shape.len();
    let (batch, m, k) = (shape[..r - 2].to_vec(), shape[r - 2], shape[r - 1]);
    let pt = transposed(cx, p)?;
    let wide = with(&batch, &[m, m, k]);
    let dims_p: Vec<i64> = (0..r as i64).collect();
    let pt = cx.b.broadcast_in_dim(pt, &wide, &dims_p)?;
    let dims_b: Vec<i64> = (0..r as i64 - 2).chain([r as i64 - 1, r as i64]).collect();
    let bw = cx.b.broadcast_in_dim(b, &wide, &dims_b)?;
    let zero = cx.full_like(pt, 0.0, None);
    let chosen = cx.b.compare(CompareDir::Ne, pt, zero)?;
    let picked = keep(cx, chosen, bw)?;
    Ok(cx.b.reduce_by(picked, &[r as i64 - 1], BinaryOp::Add)?)
}

/// Solves A X = B (`adjoint`: A^T X = B) from A's LU factors.
fn lu_solve_left(
    cx: &mut Ctx,
    packed: Value,
    order: Value,
    b: Value,
    adjoint: bool,
) -> OpResult<Value> {
    if !adjoint {
        let pb = rows_in_order(cx, b, order)?;
        let y = solve_triangular(cx, packed, pb, true, true, true, TriangularTranspose::No)?;
        return solve_triangular(cx, packed, y, true, false, false, TriangularTranspose::No);
    }
    // A^T = U^T L^T P^T: U^T Z = B, L^T W = Z, X = P W.
    let z = solve_triangular(
        cx,
        packed,
        b,
        true,
        false,
        false,
        TriangularTranspose::Transpose,
    )?;
    let w = solve_triangular(
        cx,
        packed,
        z,
        true,
        true,
        true,
        TriangularTranspose::Transpose,
    )?;
    let p = permutation_matrix(cx, order, cx.b.elem(b))?;
    matmul(cx, p, w)
}

/// Solves with LU factors on either side: X A = B is A^T X^T = B^T.
fn lu_solve(
    cx: &mut Ctx,
    packed: Value,
    order: Value,
    b: Value,
    left: bool,
    adjoint: bool,
) -> OpResult<Value> {
    if left {
        return lu_solve_left(cx, packed, order, b, adjoint);
    }
    let bt = transposed(cx, b)?;
    let xt = lu_solve_left(cx, packed, order, bt, !adjoint)?;
    transposed(cx, xt)
}

fn linalg_lu_solve(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let packed = cx.tensor(n, "LU")?;
    let pivots = cx.tensor(n, "pivots")?;
    let b = cx.tensor(n, "B")?;
    let (_, size) = square(cx, packed, "lu_solve")?;
    matrices(cx, b, "lu_solve")?;
    let left = cx.bool(n, "left", true)?;
    let adjoint = cx.bool(n, "adjoint", false)?;
    let order = order_from_pivots(cx, pivots, size)?;
    let (packed, b) = common_batch(cx, packed, b)?;
    let order = order_for(cx, order, packed)?;
    Ok(vec![Some(lu_solve(cx, packed, order, b, left, adjoint)?)])
}

/// A row order broadcast to the batch of `packed` (whose batch its own broadcasts to).
fn order_for(cx: &mut Ctx, order: Value, packed: Value) -> OpResult<Value> {
    let shape = cx.b.shape(packed).to_vec();
    let target = shape[..shape.len() - 1].to_vec();
    Ok(cx.b.broadcast_to(order, &target)?)
}

/// The sign of the row permutation: -1 for each step that swapped another row in.
fn permutation_sign(cx: &mut Ctx, swaps: Value, elem: DType) -> OpResult<Value> {
    let shape = cx.b.shape(swaps).to_vec();
    let r = shape.len();
    let steps =
        cx.b.iota(TensorType::new(shape.clone(), DType::I64), r as i64 - 1)?;
    let swapped = cx.b.compare(CompareDir::Ne, swaps, steps)?;
    let minus = cx.full_like(swaps, -1.0, Some(elem));
    let plus = cx.full_like(swaps, 1.0, Some(elem));
    let factors = cx.b.select(swapped, minus, plus)?;
    Ok(cx.b.reduce_by(factors, &[r as i64 - 1], BinaryOp::Mul)?)
}

fn linalg_det(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let a = matrix_input(cx, n)?;
    square(cx, a, "det")?;
    let f = lu(cx, a)?;
    let d = diagonal_of(cx, f.packed)?;
    let r = cx.b.ty(d).rank() as i64;
    let product = cx.b.reduce_by(d, &[r - 1], BinaryOp::Mul)?;
    let sign = permutation_sign(cx, f.swaps, cx.b.elem(a))?;
    let det = cx.b.binary(BinaryOp::Mul, product, sign)?;
    let pivots = lapack_pivots(cx, f.swaps)?;
    Ok(vec![Some(det), Some(f.packed), Some(pivots)])
}

fn linalg_slogdet(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let a = matrix_input(cx, n)?;
    square(cx, a, "slogdet")?;
    let f = lu(cx, a)?;
    let d = diagonal_of(cx, f.packed)?;
    let r = cx.b.ty(d).rank() as i64;
    let signs = cx.b.unary(UnaryOp::Sign, d)?;
    let sign = cx.b.reduce_by(signs, &[r - 1], BinaryOp::Mul)?;
    let permutation = permutation_sign(cx, f.swaps, cx.b.elem(a))?;
    let sign = cx.b.binary(BinaryOp::Mul, sign, permutation)?;
    let magnitude = cx.b.unary(UnaryOp::Abs, d)?;
    let logs = cx.b.unary(UnaryOp::Log, magnitude)?;
    let logabsdet = cx.b.reduce_by(logs, &[r - 1], BinaryOp::Add)?;
    let pivots = lapack_pivots(cx, f.swaps)?;
    Ok(vec![
        Some(sign),
        Some(logabsdet),
        Some(f.packed),
        Some(pivots),
    ])
}

fn linalg_inv_ex(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let a = matrix_input(cx, n)?;
    let (batch, size) = square(cx, a, "inv")?;
    let f = lu(cx, a)?;
    let eye = identity(cx, &batch, size, cx.b.elem(a))?;
    let x = lu_solve(cx, f.packed, f.order, eye, true, false)?;
    Ok(vec![Some(x), Some(f.info)])
}

fn linalg_solve_ex(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let a = cx.tensor(n, "A")?;
    let b = cx.tensor(n, "B")?;
    square(cx, a, "solve")?;
    let left = cx.bool(n, "left", true)?;
    let (ra, rb) = (cx.b.ty(a).rank(), cx.b.ty(b).rank());
    // B is a batch of vectors when it has one dimension less than A (torch's rule).
    let vector = rb == 1 || (rb + 1 == ra && cx.b.shape(b)[..rb - 1] == cx.b.shape(a)[..ra - 2]);
    let b_matrix = if vector {
        let mut s = cx.b.shape(b).to_vec();
        s.insert(if left { s.len() } else { s.len() - 1 }, 1);
        cx.b.reshape(b, &s)?
    } else {
        b
    };
    matrices(cx, b_matrix, "solve")?;
    let f = lu(cx, a)?;
    let (packed, b_matrix) = common_batch(cx, f.packed, b_matrix)?;
    let order = order_for(cx, f.order, packed)?;
    let x = lu_solve(cx, packed, order, b_matrix, left, false)?;
    let out = cx.out_type(n, 0)?;
    let x = cx.b.reshape(x, &out.shape)?;
    let pivots = lapack_pivots(cx, f.swaps)?;
    Ok(vec![Some(x), Some(f.packed), Some(pivots), Some(f.info)])
}

// ----- Eigendecomposition, SVD, QR ------------------------------------------------------------

/// (eigenvalues ascending, eigenvectors as columns) of symmetric matrices, reading the
/// `lower` triangle: XLA's Jacobi eigensolver, to the type's precision.
fn eigh(cx: &mut Ctx, a: Value, lower: bool) -> OpResult<(Value, Value)> {
    let ty = cx.b.ty(a).clone();
    let r = ty.rank();
    let tolerance = if ty.elem == DType::F64 {
        f64::EPSILON
    } else {
        f32::EPSILON as f64
    };
    let values = TensorType::new(ty.shape[..r - 1].to_vec(), ty.elem);
    let out = cx.b.op(
        OpKind::CustomCall {
            target: "Eigh",
            config: format!("{},1,100,{tolerance:e}", u8::from(lower)),
            results: vec![ty.clone(), values],
        },
        &[a],
    )?;
    let symmetric = symmetrized(cx, a, lower)?;
    refined_eigenpairs(cx, symmetric, out[0])
}

/// The symmetric matrix whose `lower` (or upper) triangle `a` holds.
fn symmetrized(cx: &mut Ctx, a: Value, lower: bool) -> OpResult<Value> {
    let shape = cx.b.shape(a).to_vec();
    let half = triangle(cx, &shape, 0, lower)?;
    let half = keep(cx, half, a)?;
    let strict = triangle(cx, &shape, if lower { -1 } else { 1 }, lower)?;
    let mirror = keep(cx, strict, a)?;
    let mirror = transposed(cx, mirror)?;
    Ok(cx.b.binary(BinaryOp::Add, half, mirror)?)
}

/// XLA's Jacobi solver stops when its off-diagonal norm, computed as sqrt(f - d) sqrt(f + d)
/// from the Frobenius and diagonal norms, cancels to zero: about sqrt(eps) of the matrix, so
/// its eigenvectors hold only half the type's digits. One step of first-order perturbation in
/// the eigenbasis recovers them: B = V^T A V = D + E, the eigenvectors of B are I + F with
/// F_ij = E_ij / (d_j - d_i), and V (I + F), made orthonormal by one Newton-Schulz step, has
/// errors of order E^2 / gap. Pairs too close for the expansion (|E_ij| beyond a tenth of
/// their gap: a cluster, whose basis is free) keep their vectors.
fn refined_eigenpairs(cx: &mut Ctx, a: Value, v: Value) -> OpResult<(Value, Value)> {
    let shape = cx.b.shape(v).to_vec();
    let r = shape.len();
    let n = shape[r - 1];
    let elem = cx.b.elem(v);
    let batch = shape[..r - 2].to_vec();
    let vt = transposed(cx, v)?;
    let av = matmul(cx, a, v)?;
    let b = matmul(cx, vt, av)?;
    let d = diagonal_of(cx, b)?;
    let dims_rows: Vec<i64> = (0..r as i64 - 2).chain([r as i64 - 2]).collect();
    let dims_cols: Vec<i64> = (0..r as i64 - 2).chain([r as i64 - 1]).collect();
    let d_i = cx.b.broadcast_in_dim(d, &shape, &dims_rows)?;
    let d_j = cx.b.broadcast_in_dim(d, &shape, &dims_cols)?;
    let gap = cx.b.binary(BinaryOp::Sub, d_j, d_i)?;
    let small = cx.b.unary(UnaryOp::Abs, b)?;
    let small = cx.scaled(small, 10.0)?;
    let width = cx.b.unary(UnaryOp::Abs, gap)?;
    let separated = cx.b.compare(CompareDir::Gt, width, small)?;
    let one = cx.full_like(gap, 1.0, None);
    let divisor = cx.b.select(separated, gap, one)?;
    let f = cx.b.binary(BinaryOp::Div, b, divisor)?;
    let f = keep(cx, separated, f)?;
    let eye = identity(cx, &batch, n, elem)?;
    let zero = cx.full_like(eye, 0.0, None);
    let off = cx.b.compare(CompareDir::Eq, eye, zero)?;
    let f = keep(cx, off, f)?;
    let step = cx.b.binary(BinaryOp::Add, eye, f)?;
    let v1 = matmul(cx, v, step)?;
    // Newton-Schulz: V (3I - V^T V) / 2.
    let v1t = transposed(cx, v1)?;
    let gram = matmul(cx, v1t, v1)?;
    let three = cx.scaled(eye, 3.0)?;
    let correction = cx.b.binary(BinaryOp::Sub, three, gram)?;
    let correction = cx.scaled(correction, 0.5)?;
    let v2 = matmul(cx, v1, correction)?;
    Ok((d, v2))
}

fn linalg_eigh(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let a = matrix_input(cx, n)?;
    square(cx, a, "eigh")?;
    let uplo = cx.opt_str(n, "UPLO")?.unwrap_or("L");
    let compute_v = cx.bool(n, "compute_v", !n.target.contains("eigvalsh"))?;
    let lower = match uplo {
        "L" | "l" => true,
        "U" | "u" => false,
        other => return err(format!("eigh's UPLO must be 'L' or 'U', got {other:?}")),
    };
    let (w, v) = eigh(cx, a, lower)?;
    Ok(vec![Some(w), compute_v.then_some(v)])
}

/// Singular values (descending) and vectors of A [..., m, n] from the eigendecomposition of
/// the symmetric [[0, A], [A^T, 0]]: its k = min(m, n) largest eigenvalues are the singular
/// values, with eigenvectors [u; v] / sqrt(2).
fn svd(cx: &mut Ctx, a: Value) -> OpResult<(Value, Value, Value)> {
    let (batch, m, n) = matrices(cx, a, "svd")?;
    let elem = cx.b.elem(a);
    let r = batch.len() + 2;
    let k = m.min(n);
    let at = transposed(cx, a)?;
    let zeros_m =
        cx.b.splat(&TensorType::new(with(&batch, &[m, m]), elem), 0.0);
    let zeros_n =
        cx.b.splat(&TensorType::new(with(&batch, &[n, n]), elem), 0.0);
    let top = cx.b.concatenate(&[zeros_m, a], r as i64 - 1)?;
    let bottom = cx.b.concatenate(&[at, zeros_n], r as i64 - 1)?;
    let jordan = cx.b.concatenate(&[top, bottom], r as i64 - 2)?;
    let (w, v) = eigh(cx, jordan, true)?;
    // Ascending eigenvalues: the k largest are the last k, reversed for descending order.
    let size = m + n;
    let s = cx.b.slice_dim(w, r - 2, size - k, size, 1)?;
    let s = cx.b.reverse(s, &[r as i64 - 2])?;
    let vectors = cx.b.slice_dim(v, r - 1, size - k, size, 1)?;
    let vectors = cx.b.reverse(vectors, &[r as i64 - 1])?;
    let scale = cx.full_like(vectors, std::f64::consts::SQRT_2, None);
    let vectors = cx.b.binary(BinaryOp::Mul, vectors, scale)?;
    let u = cx.b.slice_dim(vectors, r - 2, 0, m, 1)?;
    let v = cx.b.slice_dim(vectors, r - 2, m, size, 1)?;
    let vh = transposed(cx, v)?;
    Ok((u, s, vh))
}

fn linalg_svd(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let a = matrix_input(cx, n)?;
    let (_, m, cols) = matrices(cx, a, "svd")?;
    let (u, s, vh) = svd(cx, a)?;
    let compute_uv = cx.bool(n, "compute_uv", !n.target.contains("svdvals"))?;
    if n.target.contains("svdvals") {
        return Ok(vec![Some(s)]);
    }
    if !compute_uv {
        let empty_u = cx.out_type(n, 0)?;
        let empty_vh = cx.out_type(n, 2)?;
        let (eu, ev) = (cx.b.splat(&empty_u, 0.0), cx.b.splat(&empty_vh, 0.0));
        return Ok(vec![Some(eu), Some(s), Some(ev)]);
    }
    let full_default = n.target == "aten.linalg_svd.default";
    if cx.bool(n, "full_matrices", full_default)? && m != cols {
        return err(
            "not supported: svd with full_matrices=True of a non-square matrix (tpuc computes \
             the reduced SVD; pass full_matrices=False)",
        );
    }
    Ok(vec![Some(u), Some(s), Some(vh)])
}

/// `x` [..., m, k] with column j scaled by `d` [..., k]: x diag(d).
fn columns_scaled(cx: &mut Ctx, x: Value, d: Value) -> OpResult<Value> {
    let shape = cx.b.shape(x).to_vec();
    let r = shape.len() as i64;
    let dims: Vec<i64> = (0..r - 2).chain([r - 1]).collect();
    let d = cx.b.broadcast_in_dim(d, &shape, &dims)?;
    Ok(cx.b.binary(BinaryOp::Mul, x, d)?)
}

/// The polar decomposition A = U H of A [..., m, n], m >= n, from the reduced SVD A = W S V^T:
/// U = W V^T, H = V S V^T.
fn linalg_polar(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let a = matrix_input(cx, n)?;
    let (_, m, cols) = matrices(cx, a, "polar")?;
    if m < cols {
        return err(format!(
            "linalg.polar: input must have at least as many rows as columns, but got {m} by \
             {cols} matrices"
        ));
    }
    let (w, s, vh) = svd(cx, a)?;
    let u = matmul(cx, w, vh)?;
    let v = transposed(cx, vh)?;
    let vs = columns_scaled(cx, v, s)?;
    let h = matmul(cx, vs, vh)?;
    Ok(vec![Some(u), Some(h)])
}

/// The principal square root of symmetric positive-definite matrices (their lower triangles),
/// V sqrt(L) V^T from the eigendecomposition, negative eigenvalues taken as zero (as torch does).
fn linalg_matrix_sqrth(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let a = matrix_input(cx, n)?;
    square(cx, a, "matrix_sqrth")?;
    let (w, v) = eigh(cx, a, true)?;
    let zero = cx.full_like(w, 0.0, None);
    let w = cx.b.binary(BinaryOp::Max, w, zero)?;
    let root = cx.b.unary(UnaryOp::Sqrt, w)?;
    let vr = columns_scaled(cx, v, root)?;
    let vt = transposed(cx, v)?;
    Ok(vec![Some(matmul(cx, vr, vt)?)])
}

/// The old `svd(self, some, compute_uv)`: (U, S, V), V not transposed; without `compute_uv`,
/// U and V are zeros of their full shapes.
fn old_svd(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let a = cx.tensor(n, "self")?;
    let (_, m, cols) = matrices(cx, a, "svd")?;
    let (u, s, vh) = svd(cx, a)?;
    if !cx.bool(n, "compute_uv", true)? {
        let (tu, tv) = (cx.out_type(n, 0)?, cx.out_type(n, 2)?);
        return Ok(vec![
            Some(cx.b.splat(&tu, 0.0)),
            Some(s),
            Some(cx.b.splat(&tv, 0.0)),
        ]);
    }
    if !cx.bool(n, "some", true)? && m != cols {
        return err("not supported: svd with some=False of a non-square matrix (tpuc computes the reduced SVD)");
    }
    let v = transposed(cx, vh)?;
    Ok(vec![Some(u), Some(s), Some(v)])
}

/// logdet: log(det), NaN for a negative determinant and -inf for zero.
fn logdet(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let out = linalg_slogdet(cx, n)?;
    let (sign, logabs) = (out[0].expect("sign"), out[1].expect("log"));
    let zero = cx.full_like(sign, 0.0, None);
    let negative = cx.b.compare(CompareDir::Lt, sign, zero)?;
    let nan = cx.full_like(logabs, f64::NAN, None);
    Ok(vec![Some(cx.b.select(negative, nan, logabs)?)])
}

/// A tolerance of linalg.pinv per matrix ([..., 1]): a tensor (of the batch's shape), a
/// Python number, or absent.
fn pinv_tolerance(
    cx: &mut Ctx,
    n: &Node,
    name: &str,
    batch: &[i64],
    elem: DType,
) -> OpResult<Option<Value>> {
    let shape = with(batch, &[1]);
    match cx.opt_operand(n, name)? {
        None => Ok(None),
        Some(Operand::Number(v, _)) => Ok(Some(cx.b.splat(&TensorType::new(shape, elem), v))),
        Some(Operand::Tensor(t)) => {
            let t = cx.b.convert(t, elem);
            let mut grown = cx.b.shape(t).to_vec();
            grown.push(1);
            let t = cx.b.reshape(t, &grown)?;
            Ok(Some(cx.b.broadcast_to(t, &shape)?))
        }
    }
}

/// linalg.pinv as torch defines it: singular values (or, for `hermitian`, eigenvalues by
/// magnitude) above max(atol, rtol * the largest) inverted, the others dropped; rtol defaults
/// to eps * max(m, n) when atol is absent or zero.
fn linalg_pinv(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let a = cx.tensor(n, "self")?;
    let (batch, m, cols) = matrices(cx, a, "pinv")?;
    let elem = cx.b.elem(a);
    let r = batch.len() + 2;
    let hermitian = cx.bool(n, "hermitian", false)?;
    let atol = pinv_tolerance(cx, n, "atol", &batch, elem)?;
    let given_rtol = pinv_tolerance(cx, n, "rtol", &batch, elem)?;
    let eps = if elem == DType::F64 {
        f64::EPSILON
    } else {
        f32::EPSILON as f64
    };
    let default_rtol = eps * m.max(cols) as f64;
    let ones = TensorType::new(with(&batch, &[1]), elem);
    let rtol = match (given_rtol, atol) {
        (Some(rtol), _) => rtol,
        (None, None) => cx.b.splat(&ones, default_rtol),
        (None, Some(atol)) => {
            // eps * max(m, n) where atol is zero, else 0.
            let zero = cx.full_like(atol, 0.0, None);
            let atol_zero = cx.b.compare(CompareDir::Eq, atol, zero)?;
            let default = cx.full_like(atol, default_rtol, None);
            cx.b.select(atol_zero, default, zero)?
        }
    };
    let atol = match atol {
        Some(atol) => atol,
        None => cx.b.splat(&ones, 0.0),
    };
    let (left, values, right) = if hermitian {
        square(cx, a, "pinv")?;
        let (w, v) = eigh(cx, a, true)?;
        let vt = transposed(cx, v)?;
        (v, w, vt)
    } else {
        let (u, s, vh) = svd(cx, a)?;
        let v = transposed(cx, vh)?;
        let ut = transposed(cx, u)?;
        (v, s, ut)
    };
    let magnitude = cx.b.unary(UnaryOp::Abs, values)?;
    let largest = cx.b.reduce_by(magnitude, &[r as i64 - 2], BinaryOp::Max)?;
    let largest = cx.b.reshape(largest, &with(&batch, &[1]))?;
    let relative = cx.b.binary(BinaryOp::Mul, rtol, largest)?;
    let tolerance = cx.b.binary(BinaryOp::Max, atol, relative)?;
    let k_shape = cx.b.shape(values).to_vec();
    let tolerance = cx.b.broadcast_to(tolerance, &k_shape)?;
    let kept = cx.b.compare(CompareDir::Gt, magnitude, tolerance)?;
    let one = cx.full_like(values, 1.0, None);
    let divisor = cx.b.select(kept, values, one)?;
    let inverse = cx.b.binary(BinaryOp::Div, one, divisor)?;
    let inverse = keep(cx, kept, inverse)?;
    // (V * s^+) @ U^T, scaling V's columns.
    let scaled = columns_scaled(cx, left, inverse)?;
    Ok(vec![Some(matmul(cx, scaled, right)?)])
}

/// Householder QR in LAPACK's compact form (geqrf): R on and above the diagonal, the
/// reflectors' vectors below it, and their scales.
fn geqrf_of(cx: &mut Ctx, a: Value) -> OpResult<(Value, Value)> {
    let (batch, m, n) = matrices(cx, a, "qr")?;
    let ty = cx.b.ty(a).clone();
    let taus = TensorType::new(with(&batch, &[m.min(n)]), ty.elem);
    let out = cx.b.op(
        OpKind::CustomCall {
            target: "Qr",
            config: String::new(),
            results: vec![ty, taus],
        },
        &[a],
    )?;
    Ok((out[0], out[1]))
}

/// The product of the Householder reflectors in compact form (orgqr): the first `columns`
/// columns of Q [..., m, m].
fn householder_q(cx: &mut Ctx, packed: Value, taus: Value, columns: i64) -> OpResult<Value> {
    let shape = cx.b.shape(packed).to_vec();
    let r = shape.len();
    let (m, n) = (shape[r - 2], shape[r - 1]);
    let elem = cx.b.elem(packed);
    // The reflectors fill `columns` columns (zero columns and zero scales are identities).
    let packed = if n < columns {
        let mut high = vec![0; r];
        high[r - 1] = columns - n;
        let zero = cx.b.scalar(elem, 0.0);
        cx.b.pad(packed, zero, &vec![0; r], &high, &vec![0; r])?
    } else {
        cx.b.slice_dim(packed, r - 1, 0, columns, 1)?
    };
    let t = cx.b.shape(taus).to_vec();
    let taus = if t[r - 2] > columns {
        cx.b.slice_dim(taus, r - 2, 0, columns, 1)?
    } else {
        taus
    };
    let mut q_shape = shape.clone();
    q_shape[r - 2] = m;
    q_shape[r - 1] = columns;
    Ok(cx.b.op1(
        OpKind::CustomCall {
            target: "ProductOfElementaryHouseholderReflectors",
            config: String::new(),
            results: vec![TensorType::new(q_shape, elem)],
        },
        &[packed, taus],
    )?)
}

fn linalg_qr(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let a = cx.tensor(n, "A")?;
    let (_, m, cols) = matrices(cx, a, "qr")?;
    let mode = cx.opt_str(n, "mode")?.unwrap_or("reduced");
    let k = m.min(cols);
    let (packed, taus) = geqrf_of(cx, a)?;
    let shape = cx.b.shape(packed).to_vec();
    let r = shape.len();
    let upper = triangle(cx, &shape, 0, false)?;
    let rr = keep(cx, upper, packed)?;
    let (q_columns, r_rows) = match mode {
        "reduced" => (k, k),
        "complete" => (m, m),
        "r" => (0, k),
        other => {
            return err(format!(
                "qr's mode must be 'reduced', 'complete' or 'r', got {other:?}"
            ))
        }
    };
    let rr = cx.b.slice_dim(rr, r - 2, 0, r_rows.min(m), 1)?;
    let q = if q_columns == 0 {
        let empty = cx.out_type(n, 0)?;
        cx.b.splat(&empty, 0.0)
    } else {
        householder_q(cx, packed, taus, q_columns)?
    };
    Ok(vec![Some(q), Some(rr)])
}

fn geqrf(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let a = cx.tensor(n, "self")?;
    let (packed, taus) = geqrf_of(cx, a)?;
    Ok(vec![Some(packed), Some(taus)])
}

fn householder_product(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let packed = cx.tensor(n, "input")?;
    let taus = cx.tensor(n, "tau")?;
    let (_, m, cols) = matrices(cx, packed, "householder_product")?;
    if m < cols {
        return err(format!(
            "householder_product needs at least as many rows as columns, got {}",
            cx.b.ty(packed)
        ));
    }
    Ok(vec![Some(householder_q(cx, packed, taus, cols)?)])
}

/// `ormqr(A, tau, C, left, transpose)`: Q C, Q^T C, C Q or C Q^T with Q [m, m] from the
/// reflectors.
fn ormqr(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let packed = cx.tensor(n, "self")?;
    let taus = cx.tensor(n, "input2")?;
    let c = cx.tensor(n, "input3")?;
    let (_, m, _) = matrices(cx, packed, "ormqr")?;
    matrices(cx, c, "ormqr")?;
    let left = cx.bool(n, "left", true)?;
    let transpose = cx.bool(n, "transpose", false)?;
    let q = householder_q(cx, packed, taus, m)?;
    let q = if transpose { transposed(cx, q)? } else { q };
    let (q, c) = common_batch(cx, q, c)?;
    let x = if left {
        matmul(cx, q, c)?
    } else {
        matmul(cx, c, q)?
    };
    Ok(vec![Some(x)])
}

pub fn register(r: &mut Registry) {
    r.add(&["aten.linalg_cholesky_ex.default"], linalg_cholesky_ex);
    // The public ops undecomposed exports keep, each the first outputs of the one above.
    r.add(
        &["aten.linalg_cholesky.default", "aten.cholesky.default"],
        |cx, n| leading(1, linalg_cholesky_ex(cx, n)),
    );
    r.add(&["aten.linalg_det.default", "aten.det.default"], |cx, n| {
        leading(1, linalg_det(cx, n))
    });
    r.add(
        &["aten.linalg_slogdet.default", "aten.slogdet.default"],
        |cx, n| leading(2, linalg_slogdet(cx, n)),
    );
    r.add(&["aten.logdet.default"], logdet);
    r.add(
        &["aten.linalg_inv.default", "aten.inverse.default"],
        |cx, n| leading(1, linalg_inv_ex(cx, n)),
    );
    r.add(&["aten.linalg_solve.default"], |cx, n| {
        leading(1, linalg_solve_ex(cx, n))
    });
    r.add(&["aten.linalg_lu_factor.default"], |cx, n| {
        leading(2, linalg_lu_factor_ex(cx, n))
    });
    r.add(
        &["aten.linalg_eigh.default", "aten.linalg_eigvalsh.default"],
        |cx, n| leading(n.outputs.len(), linalg_eigh(cx, n)),
    );
    r.add(
        &["aten.linalg_svd.default", "aten.linalg_svdvals.default"],
        linalg_svd,
    );
    r.add(&["aten.svd.default"], old_svd);
    r.add(&["aten.linalg_polar.default"], linalg_polar);
    r.add(&["aten.linalg_matrix_sqrth.default"], linalg_matrix_sqrth);
    r.add(
        &[
            "aten.linalg_pinv.atol_rtol_tensor",
            "aten.linalg_pinv.atol_rtol_float",
        ],
        linalg_pinv,
    );
    r.add(&["aten.cholesky_solve.default"], cholesky_solve);
    r.add(&["aten.cholesky_inverse.default"], cholesky_inverse);
    r.add(
        &["aten.linalg_solve_triangular.default"],
        linalg_solve_triangular,
    );
    r.add(&["aten.triangular_solve.default"], triangular_solve);
    r.add(&["aten.linalg_lu_factor_ex.default"], linalg_lu_factor_ex);
    r.add(&["aten.linalg_lu.default"], linalg_lu);
    r.add(&["aten.lu_unpack.default"], lu_unpack);
    r.add(&["aten.linalg_lu_solve.default"], linalg_lu_solve);
    r.add(&["aten._linalg_det.default"], linalg_det);
    r.add(&["aten._linalg_slogdet.default"], linalg_slogdet);
    r.add(&["aten.linalg_inv_ex.default"], linalg_inv_ex);
    r.add(&["aten._linalg_solve_ex.default"], linalg_solve_ex);
    r.add(&["aten._linalg_eigh.default"], linalg_eigh);
    r.add(&["aten._linalg_svd.default"], linalg_svd);
    r.add(&["aten.linalg_qr.default"], linalg_qr);
    r.add(&["aten.geqrf.default"], geqrf);
    r.add(
        &["aten.linalg_householder_product.default"],
        householder_product,
    );
    r.add(&["aten.ormqr.default"], ormqr);
}
