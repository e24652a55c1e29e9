//! Random ops. tpuc's contract (docs/random.md): the numbers come from StableHLO's THREE_FRY
//! bit generator seeded by the program's seed argument, so they follow torch's distributions
//! but are not torch's numbers; a given seed gives the same numbers on every run.

use tpuc_fx::Node;

use super::prelude::*;

/// Refuses an explicit torch.Generator: the program's own generator is the only one.
fn no_generator(n: &Node) -> OpResult<()> {
    match n.arg("generator") {
        None | Some(Arg::None) => Ok(()),
        Some(_) => err("not supported: an explicit generator (tpuc draws from the program's seed)"),
    }
}

/// The float type random values are made in: float32 for 16-bit floats (rounded at the end),
/// float64 for float64.
fn working_float(elem: DType) -> DType {
    if elem == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// Uniform values in [0, 1) of `shape`, with as many random bits as `elem` has mantissa bits
/// (so that rounding to `elem` never reaches 1), in `elem`.
pub fn uniform(cx: &mut Ctx, shape: &[i64], elem: DType) -> OpResult<Value> {
    let (bits_elem, word, mantissa) = match elem {
        DType::F64 => (DType::U64, 64, 53),
        DType::F16 => (DType::U32, 32, 11),
        DType::BF16 => (DType::U32, 32, 8),
        _ => (DType::U32, 32, 24),
    };
    let bits = cx.random_bits(shape, bits_elem)?;
    let shift = cx.full_like(bits, (word - mantissa) as f64, None);
    let top = cx.b.binary(BinaryOp::ShiftRightLogical, bits, shift)?;
    let work = working_float(elem);
    let as_float = cx.b.convert(top, work);
    let scale = cx.full_like(as_float, 0.5f64.powi(mantissa), None);
    let u = cx.b.binary(BinaryOp::Mul, as_float, scale)?;
    Ok(cx.b.convert(u, elem))
}

/// Standard normal values (Box-Muller) of `shape`, in `elem`.
fn normal(cx: &mut Ctx, shape: &[i64], elem: DType) -> OpResult<Value> {
    let work = working_float(elem);
    let u1 = uniform(cx, shape, work)?;
    let u2 = uniform(cx, shape, work)?;
    // 1 - u1 lies in (0, 1]: its logarithm is finite.
    let one = cx.full_like(u1, 1.0, None);
    let positive = cx.b.binary(BinaryOp::Sub, one, u1)?;
    let log = cx.b.unary(UnaryOp::Log, positive)?;
    let minus_two = cx.full_like(log, -2.0, None);
    let radius = cx.b.binary(BinaryOp::Mul, log, minus_two)?;
    let radius = cx.b.unary(UnaryOp::Sqrt, radius)?;
    let two_pi = cx.full_like(u2, std::f64::consts::TAU, None);
    let angle = cx.b.binary(BinaryOp::Mul, u2, two_pi)?;
    let cos = cx.b.unary(UnaryOp::Cos, angle)?;
    let z = cx.b.binary(BinaryOp::Mul, radius, cos)?;
    Ok(cx.b.convert(z, elem))
}

/// Uniform values in [low, high) of `shape`, in `work`.
fn uniform_between(
    cx: &mut Ctx,
    shape: &[i64],
    low: f64,
    high: f64,
    work: DType,
) -> OpResult<Value> {
    let u = uniform(cx, shape, work)?;
    let width = cx.full_like(u, high - low, None);
    let low = cx.full_like(u, low, None);
    let scaled = cx.b.binary(BinaryOp::Mul, u, width)?;
    Ok(cx.b.binary(BinaryOp::Add, scaled, low)?)
}

/// Standard exponential values `-ln(1 - u)` of `shape`, in `work` (1 - u lies in (0, 1]: the
/// logarithm is finite).
fn standard_exponential(cx: &mut Ctx, shape: &[i64], work: DType) -> OpResult<Value> {
    let u = uniform(cx, shape, work)?;
    let one = cx.full_like(u, 1.0, None);
    let rest = cx.b.binary(BinaryOp::Sub, one, u)?;
    let log = cx.b.unary(UnaryOp::Log, rest)?;
    Ok(cx.b.unary(UnaryOp::Neg, log)?)
}

/// rand / rand_like / randn / randn_like: the output's shape and dtype are torch's record.
fn fill_random(cx: &mut Ctx, n: &Node, gaussian: bool) -> OpResult<Vec<Option<Value>>> {
    no_generator(n)?;
    let out = cx.out_type(n, 0)?;
    if !out.elem.is_float() {
        return err(format!(
            "not supported: random floats of dtype {:?}",
            out.elem
        ));
    }
    let v = if gaussian {
        normal(cx, &out.shape, out.elem)?
    } else {
        uniform(cx, &out.shape, out.elem)?
    };
    Ok(vec![Some(v)])
}

/// uniform(self, from, to): values in [from, to) shaped like self.
fn uniform_range(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    no_generator(n)?;
    let out = cx.out_type(n, 0)?;
    let from = cx.float(n, "from", Some(0.0))?;
    let to = cx.float(n, "to", Some(1.0))?;
    let v = uniform_between(cx, &out.shape, from, to, working_float(out.elem))?;
    Ok(vec![Some(cx.b.convert(v, out.elem))])
}

/// randint(low=0, high, size): integers in [low, high), from 53 random bits.
fn randint(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    no_generator(n)?;
    let out = cx.out_type(n, 0)?;
    let low = cx.int(n, "low", Some(0))?;
    let high = cx.int(n, "high", None)?;
    if high <= low {
        return err(format!("randint needs low < high, got [{low}, {high})"));
    }
    if (high - low) as f64 > 2f64.powi(53) {
        return err(format!(
            "not supported: randint over more than 2^53 values ([{low}, {high}))"
        ));
    }
    let u = uniform(cx, &out.shape, DType::F64)?;
    let width = cx.full_like(u, (high - low) as f64, None);
    let scaled = cx.b.binary(BinaryOp::Mul, u, width)?;
    let floor = cx.b.unary(UnaryOp::Floor, scaled)?;
    let offset = cx.b.convert(floor, DType::I64);
    let lowv = cx.full_like(offset, low as f64, None);
    let v = cx.b.binary(BinaryOp::Add, offset, lowv)?;
    Ok(vec![Some(cx.b.convert(v, out.elem))])
}

/// randperm(n): the positions 0..n sorted by random keys.
fn randperm(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    no_generator(n)?;
    let out = cx.out_type(n, 0)?;
    let count = cx.int(n, "n", None)?;
    if count == 0 {
        return Ok(vec![Some(cx.b.splat(&out, 0.0))]);
    }
    let keys = cx.random_bits(&[count], DType::U64)?;
    let positions = cx.b.iota(TensorType::new(vec![count], DType::I64), 0)?;
    let sorted = cx.b.sort(&[keys, positions], 0, SortOrder::Ascending)?;
    Ok(vec![Some(cx.b.convert(sorted[1], out.elem))])
}

/// bernoulli(self) with self the probabilities, or bernoulli(self, p): 1 with probability p.
fn bernoulli(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    no_generator(n)?;
    let x = cx.tensor(n, "self")?;
    let out = cx.out_type(n, 0)?;
    let work = working_float(cx.b.elem(x));
    let u = uniform(cx, &out.shape, work)?;
    let p = match cx.opt_float(n, "p")? {
        Some(p) => cx.full_like(u, p, None),
        None => cx.b.convert(x, work),
    };
    let hit = cx.b.compare(CompareDir::Lt, u, p)?;
    Ok(vec![Some(cx.b.convert(hit, out.elem))])
}

/// bernoulli.Tensor(self, p): 1 with probability `p` (a tensor broadcast to self's shape),
/// in self's dtype.
fn bernoulli_tensor(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    no_generator(n)?;
    let out = cx.out_type(n, 0)?;
    let p = cx.tensor(n, "p")?;
    let work = working_float(cx.b.elem(p));
    let p = cx.b.convert(p, work);
    let p = cx.b.broadcast_to(p, &out.shape)?;
    let u = uniform(cx, &out.shape, work)?;
    let hit = cx.b.compare(CompareDir::Lt, u, p)?;
    Ok(vec![Some(cx.b.convert(hit, out.elem))])
}

/// exponential(self, lambd): -log(1 - u) / lambd, shaped like self.
fn exponential(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    no_generator(n)?;
    let out = cx.out_type(n, 0)?;
    let rate = cx.float(n, "lambd", Some(1.0))?;
    if rate <= 0.0 || rate.is_nan() {
        return err(format!("exponential needs lambd > 0, got {rate}"));
    }
    let e = standard_exponential(cx, &out.shape, working_float(out.elem))?;
    let v = cx.scaled(e, 1.0 / rate)?;
    Ok(vec![Some(cx.b.convert(v, out.elem))])
}

/// normal_functional(self, mean, std): mean + std * N(0, 1), shaped like self.
fn normal_functional(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    no_generator(n)?;
    let out = cx.out_type(n, 0)?;
    let mean = cx.float(n, "mean", Some(0.0))?;
    let std = cx.float(n, "std", Some(1.0))?;
    if std < 0.0 || std.is_nan() {
        return err(format!("normal needs std >= 0, got {std}"));
    }
    let work = working_float(out.elem);
    let z = normal(cx, &out.shape, work)?;
    let z = cx.scaled(z, std)?;
    let shift = cx.full_like(z, mean, None);
    let v = cx.b.binary(BinaryOp::Add, z, shift)?;
    Ok(vec![Some(cx.b.convert(v, out.elem))])
}

/// multinomial(self, num_samples, replacement): category indices drawn with probability
/// proportional to each row's weights. With replacement: each draw inverts the row's
/// cumulative distribution; without: the categories of the `num_samples` largest
/// `log(w) + Gumbel noise` keys, which draws them one after another without replacement
/// (a category of weight 0 is never drawn while others remain).
fn multinomial(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    no_generator(n)?;
    let out = cx.out_type(n, 0)?;
    let w = cx.tensor(n, "self")?;
    let samples = cx.int(n, "num_samples", None)?;
    let replacement = cx.bool(n, "replacement", false)?;
    let rank = cx.b.ty(w).rank();
    if rank != 1 && rank != 2 {
        return err(format!(
            "multinomial needs 1-d or 2-d weights, got {}",
            cx.b.ty(w)
        ));
    }
    let categories = cx.b.shape(w)[rank - 1];
    if !replacement && samples > categories {
        return err(format!(
            "cannot draw {samples} samples without replacement from {categories} categories"
        ));
    }
    let rows = if rank == 2 { cx.b.shape(w)[0] } else { 1 };
    let work = working_float(cx.b.elem(w));
    let w = cx.b.convert(w, work);
    let w = cx.b.reshape(w, &[rows, categories])?;
    let picked = if replacement {
        // Draw k takes the first category whose cumulative weight exceeds u_k * total.
        let cdf = scan(cx, w, 1, BinaryOp::Add)?;
        let total =
            cx.b.slice(cdf, &[0, categories - 1], &[rows, categories], &[1, 1])?;
        let u = uniform(cx, &[rows, samples], work)?;
        let total = cx.b.broadcast_in_dim(total, &[rows, samples], &[0, 1])?;
        let target = cx.b.binary(BinaryOp::Mul, u, total)?;
        let shape = [rows, samples, categories];
        let cdf = cx.b.broadcast_in_dim(cdf, &shape, &[0, 2])?;
        let target = cx.b.broadcast_in_dim(target, &shape, &[0, 1])?;
        let below = cx.b.compare(CompareDir::Le, cdf, target)?;
        let below = cx.b.convert(below, DType::I64);
        let count = cx.b.reduce_by(below, &[2], BinaryOp::Add)?;
        let last = cx.full_like(count, (categories - 1) as f64, None);
        cx.b.binary(BinaryOp::Min, count, last)?
    } else {
        let exp_noise = standard_exponential(cx, &[rows, categories], work)?;
        // log(w) - log(E) with E ~ Exp(1): the Gumbel-max keys.
        let log_w = cx.b.unary(UnaryOp::Log, w)?;
        let log_e = cx.b.unary(UnaryOp::Log, exp_noise)?;
        let keys = cx.b.binary(BinaryOp::Sub, log_w, log_e)?;
        let positions =
            cx.b.iota(TensorType::new(vec![rows, categories], DType::I64), 1)?;
        let sorted = cx.b.sort(&[keys, positions], 1, SortOrder::Descending)?;
        cx.b.slice(sorted[1], &[0, 0], &[rows, samples], &[1, 1])?
    };
    let picked = cx.b.reshape(picked, &out.shape)?;
    Ok(vec![Some(cx.b.convert(picked, out.elem))])
}

/// rrelu_with_noise: in training each negative element is multiplied by a slope drawn
/// uniformly from [lower, upper], which the noise output records (1 for the others); in
/// evaluation the slope is (lower + upper) / 2 and the noise is unchanged. The in-place form
/// writes the noise into its `noise` argument.
fn rrelu_with_noise(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    no_generator(n)?;
    let x = cx.tensor(n, "self")?;
    let noise = cx.tensor(n, "noise")?;
    let lower = cx.float(n, "lower", Some(0.125))?;
    let upper = cx.float(n, "upper", Some(1.0 / 3.0))?;
    let training = cx.bool(n, "training", false)?;
    let elem = cx.b.elem(x);
    let zero = cx.full_like(x, 0.0, None);
    let (y, noise) = if training {
        let shape = cx.b.shape(x).to_vec();
        let slope = uniform_between(cx, &shape, lower, upper, working_float(elem))?;
        let slope = cx.b.convert(slope, elem);
        let negative = cx.b.compare(CompareDir::Le, x, zero)?;
        let one = cx.full_like(slope, 1.0, None);
        let slope = cx.b.select(negative, slope, one)?;
        let y = cx.b.binary(BinaryOp::Mul, x, slope)?;
        (y, cx.b.convert(slope, cx.b.elem(noise)))
    } else {
        let slope = cx.full_like(x, (lower + upper) / 2.0, None);
        let scaled = cx.b.binary(BinaryOp::Mul, x, slope)?;
        let negative = cx.b.compare(CompareDir::Lt, x, zero)?;
        (cx.b.select(negative, scaled, x)?, noise)
    };
    if n.target.starts_with("aten.rrelu_with_noise_functional") {
        return Ok(vec![Some(y), Some(noise)]);
    }
    if let Some(Arg::Tensor(name)) = n.arg("noise") {
        cx.rebind(name, noise);
    }
    Ok(vec![Some(y)])
}

/// native_dropout(input, p, train) -> (output, mask): each element kept with probability 1 - p
/// and scaled by 1 / (1 - p) in training; the input and an all-true mask otherwise.
fn native_dropout(cx: &mut Ctx, n: &Node) -> OpResult<Vec<Option<Value>>> {
    let x = cx.tensor(n, "input")?;
    let p = cx.float(n, "p", None)?;
    let train = match n.arg("train") {
        Some(Arg::Bool(t)) => *t,
        _ => true,
    };
    if !(0.0..=1.0).contains(&p) {
        return err(format!("dropout probability must be in [0, 1], got {p}"));
    }
    // The mask's type: torch records it only when the graph uses the mask.
    let mask_ty = cx
        .opt_out_type(n, 1)?
        .unwrap_or_else(|| cx.b.ty(x).with_elem(DType::Bool));
    if !train || p == 0.0 {
        let mask = cx.b.splat(&mask_ty, 1.0);
        return Ok(vec![Some(x), Some(mask)]);
    }
    if p == 1.0 {
        let zeros = cx.full_like(x, 0.0, None);
        let mask = cx.b.splat(&mask_ty, 0.0);
        return Ok(vec![Some(zeros), Some(mask)]);
    }
    let shape = cx.b.shape(x).to_vec();
    let work = working_float(cx.b.elem(x));
    let u = uniform(cx, &shape, work)?;
    let keep_p = cx.full_like(u, 1.0 - p, None);
    let keep = cx.b.compare(CompareDir::Lt, u, keep_p)?;
    let zeros = cx.full_like(x, 0.0, None);
    let kept = cx.b.select(keep, x, zeros)?;
    let scale = cx.full_like(kept, 1.0 / (1.0 - p), None);
    let y = cx.b.binary(BinaryOp::Mul, kept, scale)?;
    Ok(vec![Some(y), Some(cx.b.convert(keep, mask_ty.elem))])
}

pub fn register(r: &mut Registry) {
    r.add(
        &[
            "aten.rand.default",
            "aten.rand.generator",
            "aten.rand_like.default",
        ],
        |cx, n| fill_random(cx, n, false),
    );
    r.add(
        &[
            "aten.randn.default",
            "aten.randn.generator",
            "aten.randn_like.default",
        ],
        |cx, n| fill_random(cx, n, true),
    );
    r.add(&["aten.uniform.default"], uniform_range);
    r.add(&["aten.randint.default", "aten.randint.low"], randint);
    r.add(
        &["aten.randperm.default", "aten.randperm.generator"],
        randperm,
    );
    r.add(&["aten.bernoulli.default", "aten.bernoulli.p"], bernoulli);
    r.add(&["aten.native_dropout.default"], native_dropout);
    r.add(&["aten.bernoulli.Tensor"], bernoulli_tensor);
    r.add(&["aten.exponential.default"], exponential);
    r.add(&["aten.normal_functional.default"], normal_functional);
    r.add(&["aten.multinomial.default"], multinomial);
    r.add(
        &[
            "aten.rrelu_with_noise.default",
            "aten.rrelu_with_noise_functional.default",
        ],
        rrelu_with_noise,
    );
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_checks, TestGraph};
    use tpuc_fx::{Arg, DType};

    #[test]
    fn random_ops_thread_one_generator_seeded_by_the_last_argument() {
        let mut g = TestGraph::default();
        let a = g.node1(
            "aten.rand.default",
            vec![("size", Arg::Ints(vec![3]))],
            DType::F32,
            &[3],
        );
        let b = g.node1(
            "aten.rand.default",
            vec![("size", Arg::Ints(vec![3]))],
            DType::F32,
            &[3],
        );
        let text = g.text(&[&a, &b]);
        // The seed is the only argument; the second draw reads the state the first returned.
        assert_checks(
            &text,
            &[
                "func @main(%0: tensor<2xui64>)",
                "%1, %2 = stablehlo.rng_bit_generator %0",
                "stablehlo.rng_bit_generator %1",
            ],
        );
    }
}
