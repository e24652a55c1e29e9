//! The ops of tpuc's StableHLO IR: what each computes ([`OpKind`], with its attributes as Rust
//! values) and the predicates passes ask of them. Every rule that decides a result (NaN and
//! tie handling of argmax, the order a sort compares in) is stated here, where folding, tests
//! and the emitter all see it; the emitter only spells it.

use std::sync::Arc;

use tpuc_dtype::DType;

use super::attrs::{ConvAttrs, DotDims, GatherDims, Precision, ScatterDims, Sharding};
use super::func::Func;
use super::types::TensorType;

/// A value of a function: an argument or an op's result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Value(pub(super) u32);

impl Value {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    Abs,
    Neg,
    Exp,
    Expm1,
    Log,
    Log1p,
    Sqrt,
    Rsqrt,
    Cbrt,
    Tanh,
    Logistic,
    Sin,
    Cos,
    Tan,
    Floor,
    Ceil,
    RoundEven,
    RoundAwayFromZero,
    Sign,
    Not,
    /// CHLO: the plugin accepts chlo ops and decomposes them.
    Erf,
    Asin,
    Acos,
    Atan,
    Sinh,
    Cosh,
    Asinh,
    Acosh,
    Atanh,
    Lgamma,
    Digamma,
    ErfInv,
    Erfc,
    /// The exponentially scaled modified Bessel function of order one: exp(-|x|) I1(x).
    BesselI1e,
}

impl UnaryOp {
    pub fn op_name(self) -> &'static str {
        use UnaryOp::*;
        match self {
            Abs => "stablehlo.abs",
            Neg => "stablehlo.negate",
            Exp => "stablehlo.exponential",
            Expm1 => "stablehlo.exponential_minus_one",
            Log => "stablehlo.log",
            Log1p => "stablehlo.log_plus_one",
            Sqrt => "stablehlo.sqrt",
            Rsqrt => "stablehlo.rsqrt",
            Cbrt => "stablehlo.cbrt",
            Tanh => "stablehlo.tanh",
            Logistic => "stablehlo.logistic",
            Sin => "stablehlo.sine",
            Cos => "stablehlo.cosine",
            Tan => "stablehlo.tan",
            Floor => "stablehlo.floor",
            Ceil => "stablehlo.ceil",
            RoundEven => "stablehlo.round_nearest_even",
            RoundAwayFromZero => "stablehlo.round_nearest_afz",
            Sign => "stablehlo.sign",
            Not => "stablehlo.not",
            Erf => "chlo.erf",
            Asin => "chlo.asin",
            Acos => "chlo.acos",
            Atan => "chlo.atan",
            Sinh => "chlo.sinh",
            Cosh => "chlo.cosh",
            Asinh => "chlo.asinh",
            Acosh => "chlo.acosh",
            Atanh => "chlo.atanh",
            Lgamma => "chlo.lgamma",
            Digamma => "chlo.digamma",
            ErfInv => "chlo.erf_inv",
            Erfc => "chlo.erfc",
            BesselI1e => "chlo.bessel_i1e",
        }
    }

    /// Whether the op is defined only on floating-point tensors.
    pub fn float_only(self) -> bool {
        !matches!(
            self,
            UnaryOp::Abs | UnaryOp::Neg | UnaryOp::Sign | UnaryOp::Not
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    Pow,
    Max,
    Min,
    And,
    Or,
    Xor,
    Atan2,
    ShiftLeft,
    ShiftRightArithmetic,
    ShiftRightLogical,
    /// CHLO, floats only: the float after `lhs` towards `rhs`.
    NextAfter,
}

impl BinaryOp {
    pub fn op_name(self) -> &'static str {
        use BinaryOp::*;
        match self {
            Add => "stablehlo.add",
            Sub => "stablehlo.subtract",
            Mul => "stablehlo.multiply",
            Div => "stablehlo.divide",
            Rem => "stablehlo.remainder",
            Pow => "stablehlo.power",
            Max => "stablehlo.maximum",
            Min => "stablehlo.minimum",
            And => "stablehlo.and",
            Or => "stablehlo.or",
            Xor => "stablehlo.xor",
            Atan2 => "stablehlo.atan2",
            ShiftLeft => "stablehlo.shift_left",
            ShiftRightArithmetic => "stablehlo.shift_right_arithmetic",
            ShiftRightLogical => "stablehlo.shift_right_logical",
            NextAfter => "chlo.next_after",
        }
    }

    pub fn is_logical(self) -> bool {
        matches!(self, BinaryOp::And | BinaryOp::Or | BinaryOp::Xor)
    }

    /// Whether the op is defined only on floating-point tensors.
    pub fn float_only(self) -> bool {
        matches!(self, BinaryOp::Atan2 | BinaryOp::NextAfter)
    }

    pub fn is_shift(self) -> bool {
        matches!(
            self,
            BinaryOp::ShiftLeft | BinaryOp::ShiftRightArithmetic | BinaryOp::ShiftRightLogical
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CompareDir {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CompareDir {
    pub fn mnemonic(self) -> &'static str {
        match self {
            CompareDir::Eq => "EQ",
            CompareDir::Ne => "NE",
            CompareDir::Lt => "LT",
            CompareDir::Le => "LE",
            CompareDir::Gt => "GT",
            CompareDir::Ge => "GE",
        }
    }
}

/// How a comparison orders its operands (StableHLO's `comparison_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CompareType {
    /// IEEE comparison of floats (and complex numbers, for equality): NaN is unordered.
    Float,
    /// A total order of floats: -NaN < -Inf < ... < -0 < +0 < ... < +Inf < +NaN, so NaN sorts
    /// after every number, as in torch's sort.
    TotalOrder,
    Signed,
    /// Unsigned integers and booleans.
    Unsigned,
}

impl CompareType {
    /// The ordinary comparison of `elem`.
    pub fn of(elem: DType) -> CompareType {
        if elem.is_float() || elem.is_complex() {
            CompareType::Float
        } else if elem.is_unsigned() || elem.is_bool() {
            CompareType::Unsigned
        } else {
            CompareType::Signed
        }
    }

    /// Whether values of `elem` can be compared this way.
    pub fn fits(self, elem: DType) -> bool {
        match self {
            CompareType::TotalOrder => elem.is_float(),
            other => other == CompareType::of(elem),
        }
    }

    pub fn mnemonic(self) -> &'static str {
        match self {
            CompareType::Float => "FLOAT",
            CompareType::TotalOrder => "TOTALORDER",
            CompareType::Signed => "SIGNED",
            CompareType::Unsigned => "UNSIGNED",
        }
    }
}

/// The computation inside a reduce or reduce_window region.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceBody {
    /// `acc = op(acc, x)` over one operand.
    Binary(BinaryOp),
    /// Over (values, indices): the position of the largest (`largest`) or smallest value. On
    /// ties the smaller index wins; with `nan_wins` (torch's rule for floats) a NaN beats every
    /// number and the first NaN is kept.
    ArgExtremum { largest: bool, nan_wins: bool },
}

impl ReduceBody {
    /// How many operands (each with an initial value) the region combines.
    pub fn arity(self) -> usize {
        match self {
            ReduceBody::Binary(_) => 1,
            ReduceBody::ArgExtremum { .. } => 2,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SortOrder {
    Ascending,
    Descending,
}

/// What a triangular solve does to `a` first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TriangularTranspose {
    No,
    Transpose,
    Adjoint,
}

impl TriangularTranspose {
    pub fn mnemonic(self) -> &'static str {
        match self {
            TriangularTranspose::No => "NO_TRANSPOSE",
            TriangularTranspose::Transpose => "TRANSPOSE",
            TriangularTranspose::Adjoint => "ADJOINT",
        }
    }
}

/// How a scatter combines an update with the element already there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScatterMode {
    Replace,
    Combine(BinaryOp),
}

/// The transform a stablehlo.fft computes over the trailing `length.len()` dimensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FftKind {
    /// Complex to complex, forward.
    Fft,
    /// Complex to complex, inverse, scaled by 1/n.
    Ifft,
    /// Real to the non-negative half of the spectrum (last dimension n/2 + 1).
    Rfft,
    /// The inverse of Rfft, scaled by 1/n.
    Irfft,
}

impl FftKind {
    pub fn mnemonic(self) -> &'static str {
        match self {
            FftKind::Fft => "FFT",
            FftKind::Ifft => "IFFT",
            FftKind::Rfft => "RFFT",
            FftKind::Irfft => "IRFFT",
        }
    }
}

/// A function an op runs: a loop's condition or body, a branch. Closed: it reads only its
/// arguments, which the op passes it (values of the enclosing function are passed as operands,
/// never read across the boundary), and its values are numbered apart from the enclosing
/// function's. Clones of the op share it; it equals only itself (the same function, by
/// pointer), so kinds stay cheap to compare and hash.
#[derive(Clone, Debug)]
pub struct Region(Arc<Func>);

impl Region {
    pub fn new(func: Func) -> Region {
        Region(Arc::new(func))
    }

    pub fn func(&self) -> &Func {
        &self.0
    }

    /// What tells this function apart from every other (its address), for tables of them.
    pub fn id(&self) -> usize {
        Arc::as_ptr(&self.0) as usize
    }
}

impl PartialEq for Region {
    fn eq(&self, other: &Region) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Region {}

impl std::hash::Hash for Region {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        std::ptr::hash(Arc::as_ptr(&self.0), state)
    }
}

/// A dense constant: little-endian element bytes, one element when `splat`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Literal {
    pub ty: TensorType,
    pub bytes: Arc<[u8]>,
    pub splat: bool,
}

/// The value of a composite's attribute (a float as its bits, so that kinds stay comparable and
/// hashable).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum AttrValue {
    Bool(bool),
    I64(i64),
    F32(u32),
    Str(String),
}

impl AttrValue {
    pub fn f32(x: f32) -> AttrValue {
        AttrValue::F32(x.to_bits())
    }

    /// As MLIR writes it (a float by its bits: exact).
    pub fn mlir(&self) -> String {
        match self {
            AttrValue::Bool(b) => b.to_string(),
            AttrValue::I64(n) => format!("{n} : i64"),
            AttrValue::F32(bits) => format!("0x{bits:08X} : f32"),
            AttrValue::Str(s) => format!("{s:?}"),
        }
    }
}

impl std::fmt::Display for AttrValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AttrValue::F32(bits) => write!(f, "{:?}", f32::from_bits(*bits)),
            AttrValue::Str(s) => write!(f, "{s:?}"),
            AttrValue::Bool(b) => write!(f, "{b}"),
            AttrValue::I64(n) => write!(f, "{n}"),
        }
    }
}

/// A composite's attributes, by name, in the order given.
pub type Attributes = Vec<(String, AttrValue)>;

/// What an op computes. Each variant carries what its result types follow from, so that
/// [`super::typing::infer`] computes them from the operands alone: a builder and the verifier
/// apply the same rule.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    Constant(Literal),
    Iota {
        dim: i64,
        ty: TensorType,
    },
    Unary(UnaryOp),
    Binary(BinaryOp),
    Compare {
        dir: CompareDir,
        compare: CompareType,
    },
    Select,
    Clamp,
    Convert {
        to: DType,
    },
    IsFinite,
    /// The operand's bits read as `to`: one element each for types of one width; a wider
    /// operand splits into a trailing dimension of narrower elements, and narrower elements in
    /// a trailing dimension of that ratio join into one.
    BitcastConvert {
        to: DType,
    },
    /// The operand unchanged; XLA's optimisations do not look through it (see
    /// `passes::exact_division`).
    OptimizationBarrier,
    /// The Cholesky factor of each (Hermitian positive definite) matrix in the last two
    /// dimensions, lower or upper; only that triangle is read, and a matrix that is not
    /// positive definite gives NaN.
    Cholesky {
        lower: bool,
    },
    /// Solves `op(a) x = b` (`left_side`) or `x op(a) = b` for triangular `a` [..., n, n]:
    /// `a`'s `lower` or upper triangle is read, its diagonal taken as ones if `unit_diagonal`.
    TriangularSolve {
        left_side: bool,
        lower: bool,
        unit_diagonal: bool,
        transpose: TriangularTranspose,
    },
    /// A call the plugin expands itself (XLA's `Eigh`, `Qr` and
    /// `ProductOfElementaryHouseholderReflectors` expanders), with its results' types.
    CustomCall {
        target: &'static str,
        config: String,
        results: Vec<TensorType>,
    },
    BroadcastInDim {
        dims: Vec<i64>,
        shape: Vec<i64>,
    },
    Reshape {
        shape: Vec<i64>,
    },
    Transpose {
        perm: Vec<i64>,
    },
    Slice {
        start: Vec<i64>,
        limit: Vec<i64>,
        strides: Vec<i64>,
    },
    Concatenate {
        dim: i64,
    },
    Pad {
        low: Vec<i64>,
        high: Vec<i64>,
        interior: Vec<i64>,
    },
    Reverse {
        dims: Vec<i64>,
    },
    /// The operand with `update` written at the start indices given by the trailing operands
    /// (one integer scalar per dimension, clamped so that the update fits).
    DynamicUpdateSlice,
    /// The part of the operand of `sizes` at the start indices given by the trailing operands
    /// (one integer scalar per dimension, clamped so that the part fits).
    DynamicSlice {
        sizes: Vec<i64>,
    },
    DotGeneral {
        dims: DotDims,
        precision: Precision,
    },
    Convolution(ConvAttrs),
    /// Reduces `n` inputs then `n` scalar initial values over `dims` (sorted).
    Reduce {
        dims: Vec<i64>,
        body: ReduceBody,
    },
    ReduceWindow {
        window: Vec<i64>,
        strides: Vec<i64>,
        padding: Vec<(i64, i64)>,
        body: ReduceBody,
    },
    Gather(GatherDims),
    Scatter {
        dims: ScatterDims,
        mode: ScatterMode,
    },
    /// A stable sort of the operands (one shape) along `dim` by the values of operand 0,
    /// compared as `compare` says.
    Sort {
        dim: i64,
        order: SortOrder,
        compare: CompareType,
    },
    /// stablehlo.rng_bit_generator with the THREE_FRY algorithm: (state) -> (next state, bits
    /// of `shape`, u32 or u64).
    RngBitGenerator {
        shape: Vec<i64>,
        bits: DType,
    },
    /// The real or imaginary part of a complex tensor.
    Real,
    Imag,
    /// A complex tensor from its real and imaginary parts.
    Complex,
    Fft {
        kind: FftKind,
        length: Vec<i64>,
    },
    /// The operand, laid out over the module's mesh as `Sharding` says (Shardy's
    /// `sdy.sharding_constraint`, GSPMD's `Sharding` custom call).
    ShardingConstraint(Sharding),
    /// Collectives, in a module whose body runs per device (`Module::manual`): each group of
    /// devices (by device id, as `groups` lists them) combines its members' operands with `op`.
    AllReduce {
        op: BinaryOp,
        groups: Vec<Vec<i64>>,
    },
    /// The group's operands concatenated along `dim`, on every member.
    AllGather {
        dim: i64,
        groups: Vec<Vec<i64>>,
    },
    /// The group's operands combined with `op`, then split along `dim`: member i keeps part i.
    ReduceScatter {
        dim: i64,
        op: BinaryOp,
        groups: Vec<Vec<i64>>,
    },
    /// Each member splits its operand along `split_dim` into one part per member, sends part j
    /// to member j, and concatenates what it receives along `concat_dim`.
    AllToAll {
        split_dim: i64,
        concat_dim: i64,
        groups: Vec<Vec<i64>>,
    },
    /// A loop: the operands are its values' first values; while `cond` (their types to a
    /// boolean scalar) says true, `body` (their types to their types) computes the next ones;
    /// the results are the values `cond` said false of.
    While {
        cond: Region,
        body: Region,
    },
    /// A choice: operand 0, a 32-bit integer scalar, picks the branch run (one out of range
    /// picks the last, as StableHLO says); every branch takes the other operands and returns
    /// values of the result types.
    Case {
        branches: Vec<Region>,
    },
    /// A call of `callee` on the operands (of its argument types), whose results are the
    /// callee's: every call of one function shares one body, written once in the module as a
    /// private function (`func.call @name`; `name` made unique per function where two share
    /// it, `Module::callees`).
    Call {
        name: String,
        callee: Region,
    },
    /// A named pattern (`tpuc.rms_norm`) with its attributes and version, computed as its
    /// `decomposition` computes it from the operands: a backend that knows the name may run a
    /// kernel of its own instead (XLA inlines one it does not know). The decomposition is a
    /// private function of the module, like a call's.
    Composite {
        name: String,
        attributes: Attributes,
        version: i32,
        decomposition: Region,
    },
    /// A call of a function written outside tpuc (a user's kernel): a private function of the
    /// module made from the kernel's own module, once per kernel however many call it.
    Foreign(Arc<ForeignFunction>),
}

/// A function tpuc did not write (a user's JAX kernel, `tpuc.jax_op`): a module in MLIR's
/// generic form whose public `main` takes `operands` and returns `results`. tpuc checks only
/// the types; the plugin compiles the body.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ForeignFunction {
    /// What it computes, for its symbol and messages: the op it implements (`mylib.scale.default`).
    pub name: String,
    pub module: Arc<str>,
    pub operands: Vec<TensorType>,
    pub results: Vec<TensorType>,
}

impl OpKind {
    /// The op's name in StableHLO (or CHLO, or Shardy).
    pub fn name(&self) -> &'static str {
        match self {
            OpKind::Constant(_) => "stablehlo.constant",
            OpKind::Iota { .. } => "stablehlo.iota",
            OpKind::Unary(u) => u.op_name(),
            OpKind::Binary(b) => b.op_name(),
            OpKind::Compare { .. } => "stablehlo.compare",
            OpKind::Select => "stablehlo.select",
            OpKind::Clamp => "stablehlo.clamp",
            OpKind::Convert { .. } => "stablehlo.convert",
            OpKind::IsFinite => "stablehlo.is_finite",
            OpKind::BitcastConvert { .. } => "stablehlo.bitcast_convert",
            OpKind::OptimizationBarrier => "stablehlo.optimization_barrier",
            OpKind::Cholesky { .. } => "stablehlo.cholesky",
            OpKind::TriangularSolve { .. } => "stablehlo.triangular_solve",
            OpKind::CustomCall { .. } => "stablehlo.custom_call",
            OpKind::BroadcastInDim { .. } => "stablehlo.broadcast_in_dim",
            OpKind::Reshape { .. } => "stablehlo.reshape",
            OpKind::Transpose { .. } => "stablehlo.transpose",
            OpKind::Slice { .. } => "stablehlo.slice",
            OpKind::Concatenate { .. } => "stablehlo.concatenate",
            OpKind::Pad { .. } => "stablehlo.pad",
            OpKind::Reverse { .. } => "stablehlo.reverse",
            OpKind::DynamicUpdateSlice => "stablehlo.dynamic_update_slice",
            OpKind::DynamicSlice { .. } => "stablehlo.dynamic_slice",
            OpKind::DotGeneral { .. } => "stablehlo.dot_general",
            OpKind::Convolution(_) => "stablehlo.convolution",
            OpKind::Reduce { .. } => "stablehlo.reduce",
            OpKind::ReduceWindow { .. } => "stablehlo.reduce_window",
            OpKind::Gather(_) => "stablehlo.gather",
            OpKind::Scatter { .. } => "stablehlo.scatter",
            OpKind::Sort { .. } => "stablehlo.sort",
            OpKind::RngBitGenerator { .. } => "stablehlo.rng_bit_generator",
            OpKind::Real => "stablehlo.real",
            OpKind::Imag => "stablehlo.imag",
            OpKind::Complex => "stablehlo.complex",
            OpKind::Fft { .. } => "stablehlo.fft",
            OpKind::ShardingConstraint(_) => "sdy.sharding_constraint",
            OpKind::AllReduce { .. } => "stablehlo.all_reduce",
            OpKind::AllGather { .. } => "stablehlo.all_gather",
            OpKind::ReduceScatter { .. } => "stablehlo.reduce_scatter",
            OpKind::AllToAll { .. } => "stablehlo.all_to_all",
            OpKind::While { .. } => "stablehlo.while",
            OpKind::Case { .. } => "stablehlo.case",
            OpKind::Call { .. } => "func.call",
            OpKind::Composite { .. } => "stablehlo.composite",
            OpKind::Foreign(_) => "func.call",
        }
    }

    /// The functions the op runs (its regions), in the order StableHLO writes them.
    pub fn regions(&self) -> Vec<&Region> {
        match self {
            OpKind::While { cond, body } => vec![cond, body],
            OpKind::Case { branches } => branches.iter().collect(),
            OpKind::Call { callee, .. } => vec![callee],
            OpKind::Composite { decomposition, .. } => vec![decomposition],
            _ => vec![],
        }
    }

    /// The same op running `regions` instead (as many, in the order of [`OpKind::regions`]).
    pub fn with_regions(&self, mut regions: Vec<Region>) -> OpKind {
        match self {
            OpKind::While { .. } if regions.len() == 2 => {
                let body = regions.pop().expect("two regions");
                let cond = regions.pop().expect("two regions");
                OpKind::While { cond, body }
            }
            OpKind::Case { branches } if regions.len() == branches.len() => {
                OpKind::Case { branches: regions }
            }
            OpKind::Call { name, .. } if regions.len() == 1 => OpKind::Call {
                name: name.clone(),
                callee: regions.pop().expect("one region"),
            },
            OpKind::Composite {
                name,
                attributes,
                version,
                ..
            } if regions.len() == 1 => OpKind::Composite {
                name: name.clone(),
                attributes: attributes.clone(),
                version: *version,
                decomposition: regions.pop().expect("one region"),
            },
            _ => self.clone(),
        }
    }

    /// Whether the op, or an op of a function it runs, satisfies `test`.
    fn any_within(&self, test: &dyn Fn(&OpKind) -> bool) -> bool {
        test(self)
            || self
                .regions()
                .iter()
                .any(|r| r.func().ops().iter().any(|op| op.kind().any_within(test)))
    }

    /// Communicates between devices: only in a module whose body runs per device, and never
    /// computed when compiling or once for several calls.
    pub fn is_collective(&self) -> bool {
        self.any_within(&|k| {
            matches!(
                k,
                OpKind::AllReduce { .. }
                    | OpKind::AllGather { .. }
                    | OpKind::ReduceScatter { .. }
                    | OpKind::AllToAll { .. }
            )
        })
    }

    /// Cheap for the device to produce wherever it is used (XLA fuses it into its consumers):
    /// constant folding leaves such ops in place rather than materialise their values.
    pub fn is_cheap(&self) -> bool {
        matches!(
            self,
            OpKind::Constant(_) | OpKind::Iota { .. } | OpKind::BroadcastInDim { .. }
        )
    }

    /// Draws random numbers: its results differ from call to call, so it is never computed
    /// once for several calls.
    pub fn is_random(&self) -> bool {
        self.any_within(&|k| matches!(k, OpKind::RngBitGenerator { .. }))
    }

    /// Only moves, selects or relabels data, or converts it: no arithmetic. XLA folds such ops
    /// into their consumers.
    pub fn moves_data(&self) -> bool {
        matches!(
            self,
            OpKind::Constant(_)
                | OpKind::Iota { .. }
                | OpKind::Reshape { .. }
                | OpKind::Transpose { .. }
                | OpKind::BroadcastInDim { .. }
                | OpKind::Slice { .. }
                | OpKind::Concatenate { .. }
                | OpKind::Pad { .. }
                | OpKind::Reverse { .. }
                | OpKind::DynamicUpdateSlice
                | OpKind::DynamicSlice { .. }
                | OpKind::Convert { .. }
        )
    }

    /// A view that returns its operand unchanged when the operand already has the result's
    /// type (an identity transpose, a reshape or conversion to the same type).
    pub fn is_noop_view(&self, operand: &TensorType, result: &TensorType) -> bool {
        let identity = match self {
            OpKind::Transpose { perm } => perm.iter().enumerate().all(|(i, &d)| d == i as i64),
            OpKind::Reshape { .. } | OpKind::Convert { .. } => true,
            _ => false,
        };
        identity && operand == result
    }
}

/// Where an op came from: the FX node and, when known, the Python source line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Loc {
    pub node: String,
    pub file: Option<(String, u32)>,
}

impl Loc {
    pub fn unknown() -> Arc<Loc> {
        Arc::new(Loc {
            node: String::new(),
            file: None,
        })
    }
}

impl OpKind {
    /// A composite's name, attributes and decomposition; None for another op.
    pub fn composite(&self) -> Option<(&str, &Attributes, &Region)> {
        match self {
            OpKind::Composite {
                name,
                attributes,
                decomposition,
                ..
            } => Some((name, attributes, decomposition)),
            _ => None,
        }
    }

    /// The function the op calls and the name it asks for it (a call's; a composite's with
    /// `_impl` after): a private function of the module (`Module::callees` makes the symbol).
    pub fn called(&self) -> Option<(String, &Region)> {
        match self {
            OpKind::Call { name, callee } => Some((name.clone(), callee)),
            OpKind::Composite {
                name,
                decomposition,
                ..
            } => Some((format!("{name}_impl"), decomposition)),
            _ => None,
        }
    }
}
