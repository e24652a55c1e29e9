//! tpuc's StableHLO IR: one function of ops in SSA form. Builders (see `builder.rs`) compute and
//! check every result type, so a module that exists is well typed.

use std::sync::Arc;

use crate::types::TensorType;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Value(pub(crate) u32);

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
        }
    }

    pub fn is_logical(self) -> bool {
        matches!(self, BinaryOp::And | BinaryOp::Or | BinaryOp::Xor)
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

/// The computation inside a reduce or reduce_window region.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceBody {
    /// `acc = op(acc, x)` over one operand.
    Binary(BinaryOp),
    /// Over (values, indices): keep the larger value, the smaller index on ties; NaN wins.
    ArgMax,
    ArgMin,
}

/// The comparator of a sort: compares operand 0 of the two elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SortOrder {
    Ascending,
    Descending,
}

/// How a scatter combines an update with the element already there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScatterMode {
    Replace,
    Combine(BinaryOp),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DotDims {
    pub lhs_batch: Vec<i64>,
    pub rhs_batch: Vec<i64>,
    pub lhs_contracting: Vec<i64>,
    pub rhs_contracting: Vec<i64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Precision {
    Default,
    High,
    Highest,
}

impl Precision {
    pub fn mnemonic(self) -> &'static str {
        match self {
            Precision::Default => "DEFAULT",
            Precision::High => "HIGH",
            Precision::Highest => "HIGHEST",
        }
    }
}

/// How a convolution's kernel is laid out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KernelLayout {
    /// [O, I/groups, spatial...], torch's layout.
    #[default]
    OutInSpatial,
    /// [spatial..., I/groups, O], the layout XLA:CPU's convolutions read; a kernel given in
    /// torch's layout is transposed to it on every execution.
    SpatialInOut,
}

/// Convolution with input [N, C, spatial...] and output [N, O, spatial...], as in torch; the
/// kernel in `kernel` layout.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConvAttrs {
    pub strides: Vec<i64>,
    pub padding: Vec<(i64, i64)>,
    pub lhs_dilation: Vec<i64>,
    pub rhs_dilation: Vec<i64>,
    /// feature_group_count: input channels split into groups, each with its own kernels.
    pub groups: i64,
    /// batch_group_count: the input batch split into groups, each producing its share of the
    /// output channels (how a grouped convolution's kernel gradient is computed).
    pub batch_groups: i64,
    pub precision: Precision,
    pub kernel: KernelLayout,
}

impl KernelLayout {
    /// The kernel's (output channels, input channels per group, spatial sizes) from its shape.
    pub fn split(self, shape: &[i64]) -> (i64, i64, Vec<i64>) {
        let rank = shape.len();
        match self {
            KernelLayout::OutInSpatial => (shape[0], shape[1], shape[2..].to_vec()),
            KernelLayout::SpatialInOut => {
                (shape[rank - 1], shape[rank - 2], shape[..rank - 2].to_vec())
            }
        }
    }

    /// The permutation that takes a kernel in torch's layout to this one.
    pub fn from_torch(self, rank: usize) -> Vec<i64> {
        let rank = rank as i64;
        match self {
            KernelLayout::OutInSpatial => (0..rank).collect(),
            KernelLayout::SpatialInOut => (2..rank).chain([1, 0]).collect(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GatherDims {
    pub offset_dims: Vec<i64>,
    pub collapsed_slice_dims: Vec<i64>,
    pub operand_batching_dims: Vec<i64>,
    pub start_indices_batching_dims: Vec<i64>,
    pub start_index_map: Vec<i64>,
    pub index_vector_dim: i64,
    pub slice_sizes: Vec<i64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ScatterDims {
    pub update_window_dims: Vec<i64>,
    pub inserted_window_dims: Vec<i64>,
    pub input_batching_dims: Vec<i64>,
    pub scatter_indices_batching_dims: Vec<i64>,
    pub scatter_dims_to_operand_dims: Vec<i64>,
    pub index_vector_dim: i64,
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

/// A dense constant: little-endian element bytes, one element when `splat`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Literal {
    pub ty: TensorType,
    pub bytes: Arc<[u8]>,
    pub splat: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    Constant(Literal),
    Iota {
        dim: i64,
    },
    Unary(UnaryOp),
    Binary(BinaryOp),
    Compare {
        dir: CompareDir,
        cmp: &'static str,
    },
    Select,
    Clamp,
    Convert,
    IsFinite,
    BroadcastInDim {
        dims: Vec<i64>,
    },
    Reshape,
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
    DotGeneral {
        dims: DotDims,
        precision: Precision,
    },
    Convolution(ConvAttrs),
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
    Sort {
        dim: i64,
        order: SortOrder,
    },
    /// stablehlo.rng_bit_generator with the THREE_FRY algorithm: (state) -> (next state, bits).
    RngBitGenerator,
    /// The real or imaginary part of a complex tensor.
    Real,
    Imag,
    /// A complex tensor from its real and imaginary parts.
    Complex,
    Fft {
        kind: FftKind,
        length: Vec<i64>,
    },
}

/// Where an op came from: the FX node and, when known, the Python source line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Loc {
    pub node: String,
    pub file: Option<(String, u32)>,
}

#[derive(Clone, Debug)]
pub struct Op {
    pub kind: OpKind,
    pub operands: Vec<Value>,
    pub results: Vec<Value>,
    pub loc: Arc<Loc>,
}

/// Attributes of a function argument or result beyond its type.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ArgAttrs {
    /// Extra attributes spelled as MLIR (`mhlo.sharding = "{replicated}"`), in order.
    pub attrs: Vec<(String, String)>,
}

/// The `main` function of a module.
#[derive(Clone, Debug, Default)]
pub struct Func {
    pub args: Vec<Value>,
    pub arg_attrs: Vec<ArgAttrs>,
    pub ops: Vec<Op>,
    pub results: Vec<Value>,
    pub result_attrs: Vec<ArgAttrs>,
    pub(crate) types: Vec<TensorType>,
}

impl Func {
    pub fn ty(&self, v: Value) -> &TensorType {
        &self.types[v.index()]
    }

    pub fn value_count(&self) -> usize {
        self.types.len()
    }

    /// The index of the op defining each value; None for the arguments.
    pub fn defining_ops(&self) -> Vec<Option<usize>> {
        let mut defined_by = vec![None; self.value_count()];
        for (index, op) in self.ops.iter().enumerate() {
            for r in &op.results {
                defined_by[r.index()] = Some(index);
            }
        }
        defined_by
    }

    /// A new value of this type, for an op about to be added.
    pub(crate) fn add_value(&mut self, ty: TensorType) -> Value {
        self.types.push(ty);
        Value(self.types.len() as u32 - 1)
    }

    pub fn arg_types(&self) -> Vec<TensorType> {
        self.args.iter().map(|&a| self.ty(a).clone()).collect()
    }

    pub fn result_types(&self) -> Vec<TensorType> {
        self.results.iter().map(|&r| self.ty(r).clone()).collect()
    }
}

/// A module: its `main` function plus module-level attributes (e.g. a Shardy mesh).
#[derive(Clone, Debug, Default)]
pub struct Module {
    pub main: Func,
    /// Extra module-body ops or attributes spelled as MLIR (e.g. `sdy.mesh`), in order.
    pub attrs: Vec<(String, String)>,
}
