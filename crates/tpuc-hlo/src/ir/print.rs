//! tpuc's own text form of the IR, for tests and dumps: one line per op with its attributes as
//! the IR holds them (not MLIR's spelling), its result types and where it came from.
//!
//! ```text
//! mesh [dp=2] (shardy)
//! func @main(%0: tensor<4x8xf32> sharding [{dp}, {}], %1: tensor<8xf32>) {
//!   %2 = stablehlo.broadcast_in_dim %1 dims=[1] shape=[4, 8] : tensor<4x8xf32>  // add (m.py:3)
//!   %3 = stablehlo.add %0, %2 : tensor<4x8xf32>  // add (m.py:3)
//!   return %3
//! }
//! ```

use std::fmt::Write as _;

use super::attrs::{ArgAttrs, Sharding, ShardingDialect};
use super::func::{Callees, Func, Module};
use super::literal::scalar_text;
use super::ops::{OpKind, ReduceBody, Value};

/// The module as text.
pub fn print(module: &Module) -> String {
    let mut out = String::new();
    if let Some(m) = &module.sharding {
        let axes: Vec<String> = m
            .mesh
            .axes
            .iter()
            .map(|a| format!("{}={}", a.name, a.size))
            .collect();
        let dialect = match m.dialect {
            ShardingDialect::Shardy => "shardy",
            ShardingDialect::Gspmd => "gspmd",
        };
        // A manual module's types are each device's.
        let per_device = if module.manual { ", per device" } else { "" };
        let _ = writeln!(out, "mesh [{}] ({dialect}{per_device})", axes.join(", "));
    }
    let callees = module.callees();
    print_func(&mut out, &module.main, "func @main", "", &callees);
    for (symbol, callee) in callees.functions() {
        print_func(
            &mut out,
            callee.func(),
            &format!("func private @{symbol}"),
            "",
            &callees,
        );
    }
    for (symbol, function) in callees.foreign() {
        let _ = writeln!(
            out,
            "func private @{symbol}: the kernel of {} ({} bytes of StableHLO)",
            function.name,
            function.module.len()
        );
    }
    out
}

fn value(v: Value) -> String {
    format!("%{}", v.index())
}

fn values(vs: &[Value]) -> String {
    vs.iter().map(|&v| value(v)).collect::<Vec<_>>().join(", ")
}

fn sharding_text(s: &Sharding) -> String {
    let dims: Vec<String> = s
        .dims
        .iter()
        .map(|axes| format!("{{{}}}", axes.join(", ")))
        .collect();
    format!("[{}]", dims.join(", "))
}

fn with_attrs(f: &Func, v: Value, attrs: &ArgAttrs) -> String {
    match &attrs.sharding {
        Some(s) => format!("{}: {} sharding {}", value(v), f.ty(v), sharding_text(s)),
        None => format!("{}: {}", value(v), f.ty(v)),
    }
}

/// `f` as `header(arguments) { ops; return }`, each line after `indent`; an op's regions
/// follow it, indented below it, but for a call's: called functions follow `main`, named by
/// `callees`.
fn print_func(out: &mut String, f: &Func, header: &str, indent: &str, callees: &Callees) {
    let args: Vec<String> = f
        .args()
        .iter()
        .zip(f.arg_attrs())
        .map(|(&a, attrs)| with_attrs(f, a, attrs))
        .collect();
    let _ = writeln!(out, "{indent}{header}({}) {{", args.join(", "));
    for op in f.ops() {
        let types: Vec<String> = op.results().iter().map(|&r| f.ty(r).to_string()).collect();
        let mut line = format!("{indent}  {} = {}", values(op.results()), op.kind().name());
        if !op.operands().is_empty() {
            let _ = write!(line, " {}", values(op.operands()));
        }
        if let Some((_, callee)) = op.kind().called() {
            let _ = write!(line, " @{}", callees.symbol(callee).unwrap_or("?"));
        }
        if let OpKind::Foreign(function) = op.kind() {
            let _ = write!(
                line,
                " @{}",
                callees.foreign_symbol(function).unwrap_or("?")
            );
        }
        for (key, text) in attributes(op.kind()) {
            let _ = write!(line, " {key}={text}");
        }
        let _ = write!(line, " : {}", types.join(", "));
        let loc = op.loc();
        if !loc.node.is_empty() {
            let _ = write!(line, "  // {}", loc.node);
            if let Some((file, n)) = &loc.file {
                let _ = write!(line, " ({file}:{n})");
            }
        }
        let _ = writeln!(out, "{line}");
        let names = region_names(op.kind());
        for (region, name) in op.kind().regions().into_iter().zip(names) {
            print_func(out, region.func(), &name, &format!("{indent}    "), callees);
        }
    }
    let results: Vec<String> = f
        .results()
        .iter()
        .zip(f.result_attrs())
        .map(|(&r, attrs)| match &attrs.sharding {
            Some(s) => format!("{} sharding {}", value(r), sharding_text(s)),
            None => value(r),
        })
        .collect();
    let _ = writeln!(out, "{indent}  return {}", results.join(", "));
    let _ = writeln!(out, "{indent}}}");
}

/// What each region of an op is called in the text.
fn region_names(kind: &OpKind) -> Vec<String> {
    match kind {
        OpKind::While { .. } => vec!["cond".into(), "body".into()],
        OpKind::Case { branches } => (0..branches.len()).map(|i| format!("branch {i}")).collect(),
        // Called functions are printed once, after `main`.
        _ => vec![],
    }
}

fn list<T: std::fmt::Debug>(v: &[T]) -> String {
    format!("{v:?}")
}

fn body(b: &ReduceBody) -> String {
    match b {
        ReduceBody::Binary(op) => op.op_name().to_string(),
        ReduceBody::ArgExtremum { largest, nan_wins } => format!(
            "arg{}{}",
            if *largest { "max" } else { "min" },
            if *nan_wins { "(nan wins)" } else { "" }
        ),
    }
}

/// The op's attributes as (name, text), in a fixed order.
fn attributes(kind: &OpKind) -> Vec<(&'static str, String)> {
    match kind {
        OpKind::Constant(lit) if lit.splat => vec![("splat", scalar_text(lit.ty.elem, &lit.bytes))],
        OpKind::Constant(lit) => vec![("elements", lit.ty.numel().to_string())],
        OpKind::Iota { dim, .. } => vec![("dim", dim.to_string())],
        OpKind::Compare { dir, compare } => vec![
            ("dir", dir.mnemonic().into()),
            ("type", compare.mnemonic().into()),
        ],
        OpKind::Convert { to } | OpKind::BitcastConvert { to } => vec![("to", to.to_string())],
        OpKind::Cholesky { lower } => vec![("lower", lower.to_string())],
        OpKind::TriangularSolve {
            left_side,
            lower,
            unit_diagonal,
            transpose,
        } => vec![
            ("left", left_side.to_string()),
            ("lower", lower.to_string()),
            ("unit", unit_diagonal.to_string()),
            ("transpose", transpose.mnemonic().into()),
        ],
        OpKind::CustomCall { target, config, .. } => {
            vec![
                ("target", target.to_string()),
                ("config", format!("{config:?}")),
            ]
        }
        OpKind::BroadcastInDim { dims, shape } => {
            vec![("dims", list(dims)), ("shape", list(shape))]
        }
        OpKind::Reshape { shape } => vec![("shape", list(shape))],
        OpKind::Transpose { perm } => vec![("perm", list(perm))],
        OpKind::Slice {
            start,
            limit,
            strides,
        } => vec![
            ("start", list(start)),
            ("limit", list(limit)),
            ("strides", list(strides)),
        ],
        OpKind::Concatenate { dim } => vec![("dim", dim.to_string())],
        OpKind::Pad {
            low,
            high,
            interior,
        } => vec![
            ("low", list(low)),
            ("high", list(high)),
            ("interior", list(interior)),
        ],
        OpKind::Reverse { dims } => vec![("dims", list(dims))],
        OpKind::DynamicUpdateSlice => vec![],
        OpKind::DynamicSlice { sizes } => vec![("sizes", list(sizes))],
        OpKind::DotGeneral { dims, precision } => vec![
            (
                "batch",
                format!("{:?}x{:?}", dims.lhs_batch, dims.rhs_batch),
            ),
            (
                "contracting",
                format!("{:?}x{:?}", dims.lhs_contracting, dims.rhs_contracting),
            ),
            ("precision", precision.name().into()),
        ],
        OpKind::Convolution(c) => vec![
            ("strides", list(&c.strides)),
            ("padding", list(&c.padding)),
            ("lhs_dilation", list(&c.lhs_dilation)),
            ("rhs_dilation", list(&c.rhs_dilation)),
            ("groups", c.groups.to_string()),
            ("batch_groups", c.batch_groups.to_string()),
            ("kernel", format!("{:?}", c.kernel)),
            ("precision", c.precision.name().into()),
        ],
        OpKind::Reduce { dims, body: b } => vec![("dims", list(dims)), ("body", body(b))],
        OpKind::ReduceWindow {
            window,
            strides,
            padding,
            body: b,
        } => vec![
            ("window", list(window)),
            ("strides", list(strides)),
            ("padding", list(padding)),
            ("body", body(b)),
        ],
        OpKind::Gather(g) => vec![("dims", format!("{g:?}"))],
        OpKind::Scatter { dims, mode } => {
            vec![("dims", format!("{dims:?}")), ("mode", format!("{mode:?}"))]
        }
        OpKind::Sort {
            dim,
            order,
            compare,
        } => vec![
            ("dim", dim.to_string()),
            ("order", format!("{order:?}")),
            ("type", compare.mnemonic().into()),
        ],
        OpKind::RngBitGenerator { .. } => vec![("algorithm", "THREE_FRY".into())],
        OpKind::Fft { kind, length } => {
            vec![("kind", kind.mnemonic().into()), ("length", list(length))]
        }
        OpKind::ShardingConstraint(s) => vec![("sharding", sharding_text(s))],
        OpKind::AllReduce { op, groups } => {
            vec![("op", op.op_name().into()), ("groups", list(groups))]
        }
        OpKind::AllGather { dim, groups } => {
            vec![("dim", dim.to_string()), ("groups", list(groups))]
        }
        OpKind::ReduceScatter { dim, op, groups } => vec![
            ("dim", dim.to_string()),
            ("op", op.op_name().into()),
            ("groups", list(groups)),
        ],
        OpKind::AllToAll {
            split_dim,
            concat_dim,
            groups,
        } => vec![
            ("split", split_dim.to_string()),
            ("concat", concat_dim.to_string()),
            ("groups", list(groups)),
        ],
        OpKind::While { .. } | OpKind::Case { .. } | OpKind::Call { .. } | OpKind::Foreign(_) => {
            vec![]
        }
        OpKind::Composite {
            name,
            attributes,
            version,
            ..
        } => {
            let each: Vec<String> = attributes.iter().map(|(k, v)| format!("{k}={v}")).collect();
            vec![
                ("name", format!("{name:?}")),
                ("attributes", format!("{{{}}}", each.join(", "))),
                ("version", version.to_string()),
            ]
        }
        OpKind::Unary(_)
        | OpKind::Binary(_)
        | OpKind::Select
        | OpKind::Clamp
        | OpKind::IsFinite
        | OpKind::OptimizationBarrier
        | OpKind::Real
        | OpKind::Imag
        | OpKind::Complex => vec![],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{ArgAttrs, BinaryOp, Builder, DType, Loc, Mesh, MeshSharding, TensorType};
    use std::sync::Arc;

    #[test]
    fn prints_ops_attributes_types_shardings_and_locations() {
        let mut b = Builder::new();
        let x = b.arg(
            TensorType::new(vec![4, 8], DType::F32),
            ArgAttrs {
                sharding: Some(Sharding::split(2, 0, "dp")),
                ..ArgAttrs::default()
            },
        );
        let w = b.arg(TensorType::new(vec![8], DType::F32), ArgAttrs::default());
        b.set_loc(Arc::new(Loc {
            node: "add".into(),
            file: Some(("m.py".into(), 3)),
        }));
        let wide = b.broadcast_in_dim(w, &[4, 8], &[1]).unwrap();
        let y = b.binary(BinaryOp::Add, x, wide).unwrap();
        let module = Module {
            main: b.finish(vec![y], vec![]),
            sharding: Some(MeshSharding {
                mesh: Mesh::line("dp", 2),
                dialect: ShardingDialect::Shardy,
            }),
            manual: false,
        };
        assert_eq!(
            print(&module),
            "mesh [dp=2] (shardy)\n\
             func @main(%0: tensor<4x8xf32> sharding [{dp}, {}], %1: tensor<8xf32>) {\n\
             \x20 %2 = stablehlo.broadcast_in_dim %1 dims=[1] shape=[4, 8] : tensor<4x8xf32>  // add (m.py:3)\n\
             \x20 %3 = stablehlo.add %0, %2 : tensor<4x8xf32>  // add (m.py:3)\n\
             \x20 return %3\n\
             }\n"
        );
    }
}
