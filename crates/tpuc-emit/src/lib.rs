//! tpuc's emitter, the only crate that links MLIR (melior): turns the IR into an MLIR module in
//! generic op form, with opaque StableHLO and Shardy attributes spelled as the XLA plugin
//! expects, and prints it as text or writes bytecode. Nothing here decides a type or a rule:
//! the IR already holds them; this crate only spells them.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::Arc;

use melior::dialect::DialectHandle;
use melior::ir::attribute::{StringAttribute, TypeAttribute};
use melior::ir::block::BlockLike;
use melior::ir::operation::{OperationBuilder, OperationLike, OperationPrintingFlags};
use melior::ir::r#type::FunctionType;
use melior::ir::RegionLike;
use melior::ir::ValueLike;
use melior::ir::{
    Attribute, Block, BlockRef, Identifier, Location, Module as MlirModule, Region, Type,
    Value as MlirValue,
};
use melior::Context;

use tpuc_hlo::ir::*;

mod foreign;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmitFormat {
    /// MLIR text (generic form for StableHLO ops), with locations.
    Text,
    /// MLIR bytecode.
    Bytecode,
}

#[derive(Debug, thiserror::Error)]
pub enum EmitError {
    #[error("internal error: MLIR rejected {what} `{text}` (op at {node})")]
    Parse {
        what: &'static str,
        text: String,
        node: String,
    },
    #[error("internal error: MLIR could not build {op} (at {node}): {message}")]
    Build {
        op: String,
        node: String,
        message: String,
    },
    #[error("internal error: printing the module failed: {0}")]
    Print(String),
    #[error("internal error: {0}")]
    Invalid(String),
    /// A user's kernel that cannot join the module (its module does not parse, or has another
    /// signature than its op).
    #[error("the kernel of {name}: {message}")]
    Kernel { name: String, message: String },
}

/// Emits `module` as text or bytecode.
pub fn emit(module: &Module, format: EmitFormat) -> Result<Vec<u8>, EmitError> {
    let context = Context::new();
    context.set_allow_unregistered_dialects(true);
    DialectHandle::func().load_dialect(&context);
    let mut e = Emitter {
        ctx: &context,
        types: HashMap::new(),
        locs: HashMap::new(),
        channels: 0,
        callees: module.callees(),
    };
    let mlir = e.module(module)?;
    match format {
        EmitFormat::Text => {
            let flags = OperationPrintingFlags::new().enable_debug_info(true, false);
            let text = mlir
                .as_operation()
                .to_string_with_flags(flags)
                .map_err(|err| EmitError::Print(err.to_string()))?;
            Ok(text.into_bytes())
        }
        EmitFormat::Bytecode => Ok(mlir.as_operation().write_bytecode()),
    }
}

/// Text of `module` (convenience for tests and tools).
pub fn emit_text(module: &Module) -> Result<String, EmitError> {
    emit(module, EmitFormat::Text).map(|b| String::from_utf8(b).expect("MLIR prints UTF-8"))
}

struct Emitter<'c> {
    ctx: &'c Context,
    types: HashMap<TensorType, Type<'c>>,
    locs: HashMap<*const Loc, Location<'c>>,
    /// Channels given to collectives so far (each collective has its own).
    channels: i64,
    /// The functions the module's calls run, by symbol name.
    callees: Callees,
}

fn dims_list(v: &[i64]) -> String {
    let parts: Vec<String> = v.iter().map(i64::to_string).collect();
    parts.join(", ")
}

fn array_i64(v: &[i64]) -> String {
    if v.is_empty() {
        "array<i64>".into()
    } else {
        format!("array<i64: {}>", dims_list(v))
    }
}

fn padding_attr(p: &[(i64, i64)]) -> String {
    let rows: Vec<String> = p.iter().map(|(l, h)| format!("[{l}, {h}]")).collect();
    format!("dense<[{}]> : tensor<{}x2xi64>", rows.join(", "), p.len())
}

fn precision_attr(p: Precision) -> String {
    let one = format!("#stablehlo<precision {}>", p.mnemonic());
    format!("[{one}, {one}]")
}

impl<'c> Emitter<'c> {
    fn ty(&mut self, t: &TensorType) -> Result<Type<'c>, EmitError> {
        if let Some(ty) = self.types.get(t) {
            return Ok(*ty);
        }
        let text = t.to_string();
        let ty = Type::parse(self.ctx, &text).ok_or_else(|| EmitError::Parse {
            what: "type",
            text,
            node: String::new(),
        })?;
        self.types.insert(t.clone(), ty);
        Ok(ty)
    }

    fn loc(&mut self, loc: &Arc<Loc>) -> Location<'c> {
        let key = Arc::as_ptr(loc);
        if let Some(l) = self.locs.get(&key) {
            return *l;
        }
        let child = match &loc.file {
            Some((file, line)) => Location::new(self.ctx, file, *line as usize, 0),
            None => Location::unknown(self.ctx),
        };
        let l = if loc.node.is_empty() {
            child
        } else {
            Location::name(self.ctx, &loc.node, child)
        };
        self.locs.insert(key, l);
        l
    }

    fn attr(&self, text: &str, node: &str) -> Result<Attribute<'c>, EmitError> {
        Attribute::parse(self.ctx, text).ok_or_else(|| EmitError::Parse {
            what: "attribute",
            text: if text.len() > 200 {
                format!("{}...", &text[..200])
            } else {
                text.to_string()
            },
            node: node.to_string(),
        })
    }

    fn module(&mut self, m: &Module) -> Result<MlirModule<'c>, EmitError> {
        let unknown = Location::unknown(self.ctx);
        let module = MlirModule::new(unknown);
        if let Some(MeshSharding {
            mesh,
            dialect: ShardingDialect::Shardy,
        }) = &m.sharding
        {
            let attrs = vec![
                (
                    Identifier::new(self.ctx, "sym_name"),
                    StringAttribute::new(self.ctx, MESH).into(),
                ),
                (
                    Identifier::new(self.ctx, "mesh"),
                    self.attr(&shardy_mesh(mesh), "module")?,
                ),
            ];
            let op = OperationBuilder::new("sdy.mesh", unknown)
                .add_attributes(&attrs)
                .build()
                .map_err(|e| EmitError::Build {
                    op: "sdy.mesh".into(),
                    node: String::new(),
                    message: e.to_string(),
                })?;
            module.body().append_operation(op);
        }
        let f = &m.main;
        let types = |e: &mut Self, list: Vec<TensorType>| {
            list.iter().map(|t| e.ty(t)).collect::<Result<Vec<_>, _>>()
        };
        let arg_types = types(self, m.outer_arg_types())?;
        let result_types = types(self, m.outer_result_types())?;
        let block = Block::new(&arg_types.iter().map(|&t| (t, unknown)).collect::<Vec<_>>());
        let region = Region::new();
        let block_ref = region.append_block(block);
        let returned: Vec<MlirValue> = if m.manual {
            let args: Vec<MlirValue> = (0..arg_types.len())
                .map(|i| block_ref.argument(i).expect("argument exists").into())
                .collect();
            let manual = self.manual_computation(m, &args, &result_types)?;
            let op_ref = block_ref.append_operation(manual);
            (0..result_types.len())
                .map(|i| op_ref.result(i).expect("result exists").into())
                .collect()
        } else {
            self.body(m, block_ref)?
        };
        block_ref.append_operation(build("func.return", unknown, &returned)?);
        let fn_type = FunctionType::new(self.ctx, &arg_types, &result_types);
        let mut attrs = vec![
            (
                Identifier::new(self.ctx, "sym_name"),
                StringAttribute::new(self.ctx, "main").into(),
            ),
            (
                Identifier::new(self.ctx, "function_type"),
                TypeAttribute::new(fn_type.into()).into(),
            ),
        ];
        for (name, list) in [
            ("arg_attrs", f.arg_attrs()),
            ("res_attrs", f.result_attrs()),
        ] {
            if list
                .iter()
                .any(|a| a.sharding.is_some() || a.aliased_result.is_some())
            {
                let dicts: Vec<String> = list
                    .iter()
                    .map(|a| {
                        let mut entries = Vec::new();
                        if let (Some(s), Some(mesh)) = (&a.sharding, &m.sharding) {
                            let (key, text) = sharding_attr(mesh, s);
                            entries.push(format!("{key} = {text}"));
                        }
                        // XLA's input-output alias: the argument's buffer becomes the result's.
                        if let Some(r) = a.aliased_result {
                            entries.push(format!("tf.aliasing_output = {r} : i32"));
                        }
                        format!("{{{}}}", entries.join(", "))
                    })
                    .collect();
                attrs.push((
                    Identifier::new(self.ctx, name),
                    self.attr(&format!("[{}]", dicts.join(", ")), "main")?,
                ));
            }
        }
        let func = OperationBuilder::new("func.func", unknown)
            .add_attributes(&attrs)
            .add_regions([region])
            .build()
            .map_err(|e| EmitError::Build {
                op: "func.func".into(),
                node: String::new(),
                message: e.to_string(),
            })?;
        module.body().append_operation(func);
        for (symbol, callee) in self.callees.functions().to_vec() {
            let func = self.private_function(&symbol, callee.func(), m)?;
            module.body().append_operation(func);
        }
        let mut taken: HashSet<String> = std::iter::once("main".to_string())
            .chain(self.callees.functions().iter().map(|(s, _)| s.clone()))
            .collect();
        for (symbol, function) in self.callees.foreign().to_vec() {
            let ctx = self.ctx;
            foreign::splice(ctx, &module, &symbol, &function, &mut taken, &mut |t| {
                self.ty(t)
            })?;
        }
        Ok(module)
    }

    /// The symbol of `callee`, a function of the module's calls and composites.
    fn symbol(&self, callee: &tpuc_hlo::ir::Region, node: &str) -> Result<String, EmitError> {
        self.callees
            .symbol(callee)
            .map(str::to_string)
            .ok_or_else(|| EmitError::Invalid(format!("(at {node}) a function not found")))
    }

    /// `f`, a function the module's calls run, as `func.func private @symbol`.
    fn private_function(
        &mut self,
        symbol: &str,
        f: &Func,
        m: &Module,
    ) -> Result<melior::ir::Operation<'c>, EmitError> {
        let unknown = Location::unknown(self.ctx);
        let arg_types = f
            .arg_types()
            .iter()
            .map(|t| self.ty(t))
            .collect::<Result<Vec<_>, _>>()?;
        let result_types = f
            .result_types()
            .iter()
            .map(|t| self.ty(t))
            .collect::<Result<Vec<_>, _>>()?;
        let region = Region::new();
        let block = region.append_block(Block::new(
            &arg_types.iter().map(|&t| (t, unknown)).collect::<Vec<_>>(),
        ));
        let args = (0..arg_types.len())
            .map(|i| block.argument(i).expect("argument exists").into())
            .collect();
        let returned = self.func_body(f, m, block, args)?;
        block.append_operation(build("func.return", unknown, &returned)?);
        let fn_type = FunctionType::new(self.ctx, &arg_types, &result_types);
        let attrs = vec![
            (
                Identifier::new(self.ctx, "sym_name"),
                StringAttribute::new(self.ctx, symbol).into(),
            ),
            (
                Identifier::new(self.ctx, "sym_visibility"),
                StringAttribute::new(self.ctx, "private").into(),
            ),
            (
                Identifier::new(self.ctx, "function_type"),
                TypeAttribute::new(fn_type.into()).into(),
            ),
        ];
        OperationBuilder::new("func.func", unknown)
            .add_attributes(&attrs)
            .add_regions([region])
            .build()
            .map_err(|e| EmitError::Build {
                op: "func.func".into(),
                node: symbol.to_string(),
                message: e.to_string(),
            })
    }

    /// `m.main`'s ops appended to `block`, whose arguments are `main`'s; what `main` returns.
    fn body<'b>(
        &mut self,
        m: &Module,
        block: BlockRef<'c, 'b>,
    ) -> Result<Vec<MlirValue<'c, 'b>>, EmitError> {
        let args = (0..m.main.args().len())
            .map(|i| block.argument(i).expect("argument exists").into())
            .collect();
        self.func_body(&m.main, m, block, args)
    }

    /// The ops of `f` (`main` or a region of one of `m`'s ops) appended to `block`, its
    /// arguments standing for `args`; what `f` returns.
    fn func_body<'b>(
        &mut self,
        f: &Func,
        m: &Module,
        block: BlockRef<'c, 'b>,
        args: Vec<MlirValue<'c, 'b>>,
    ) -> Result<Vec<MlirValue<'c, 'b>>, EmitError> {
        let mut values: Vec<Option<MlirValue<'c, 'b>>> = vec![None; f.value_count()];
        for (&a, value) in f.args().iter().zip(args) {
            values[a.index()] = Some(value);
        }
        for op in f.ops() {
            let built = self.op(op, f, m, &values)?;
            let op_ref = block.append_operation(built);
            for (i, &r) in op.results().iter().enumerate() {
                values[r.index()] = Some(op_ref.result(i).expect("result exists").into());
            }
        }
        Ok(f.results()
            .iter()
            .map(|r| values[r.index()].expect("defined"))
            .collect())
    }

    /// `sdy.manual_computation` over every axis of the module's mesh, on `args` (the whole
    /// values), its region `main`'s body on each device's parts.
    fn manual_computation(
        &mut self,
        m: &Module,
        args: &[MlirValue<'c, '_>],
        result_types: &[Type<'c>],
    ) -> Result<melior::ir::Operation<'c>, EmitError> {
        let unknown = Location::unknown(self.ctx);
        let Some(MeshSharding {
            mesh,
            dialect: ShardingDialect::Shardy,
        }) = &m.sharding
        else {
            return Err(EmitError::Invalid(
                "a manual module needs a Shardy mesh".into(),
            ));
        };
        let f = &m.main;
        let local = f
            .args()
            .iter()
            .map(|&a| Ok((self.ty(f.ty(a))?, unknown)))
            .collect::<Result<Vec<_>, EmitError>>()?;
        let region = Region::new();
        let block = region.append_block(Block::new(&local));
        let returned = self.body(m, block)?;
        block.append_operation(build("sdy.return", unknown, &returned)?);
        let per_value = |attrs: &[ArgAttrs]| -> Result<String, EmitError> {
            let each = attrs
                .iter()
                .map(|a| match &a.sharding {
                    Some(s) => Ok(format!("<@{MESH}, {}>", shardy_dims(s))),
                    None => Err(EmitError::Invalid(
                        "a manual module's arguments and results have shardings".into(),
                    )),
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(format!("#sdy.sharding_per_value<[{}]>", each.join(", ")))
        };
        let axes: Vec<String> = mesh
            .axes
            .iter()
            .map(|a| format!("\"{}\"", a.name))
            .collect();
        let attrs = [
            ("in_shardings", per_value(f.arg_attrs())?),
            ("out_shardings", per_value(f.result_attrs())?),
            (
                "manual_axes",
                format!("#sdy<manual_axes{{{}}}>", axes.join(", ")),
            ),
        ]
        .iter()
        .map(|(k, v)| Ok((Identifier::new(self.ctx, k), self.attr(v, "main")?)))
        .collect::<Result<Vec<_>, EmitError>>()?;
        OperationBuilder::new("sdy.manual_computation", unknown)
            .add_operands(args)
            .add_results(result_types)
            .add_attributes(&attrs)
            .add_regions([region])
            .build()
            .map_err(|e| EmitError::Build {
                op: "sdy.manual_computation".into(),
                node: String::new(),
                message: e.to_string(),
            })
    }

    /// The attributes every collective carries: its groups of devices by global id, and a
    /// channel of its own (as XLA's SPMD programs give cross-device collectives).
    fn collective_attrs(
        &mut self,
        groups: &[Vec<i64>],
        global_ids: bool,
    ) -> Vec<(&'static str, String)> {
        self.channels += 1;
        let rows: Vec<String> = groups
            .iter()
            .map(|g| format!("[{}]", dims_list(g)))
            .collect();
        let size = groups.first().map_or(0, Vec::len);
        let mut attrs = vec![
            (
                "replica_groups",
                format!(
                    "dense<[{}]> : tensor<{}x{size}xi64>",
                    rows.join(", "),
                    groups.len()
                ),
            ),
            (
                "channel_handle",
                format!(
                    "#stablehlo.channel_handle<handle = {}, type = 1>",
                    self.channels
                ),
            ),
        ];
        if global_ids {
            attrs.push(("use_global_device_ids", "unit".into()));
        }
        attrs
    }

    fn op<'a>(
        &mut self,
        op: &Op,
        f: &Func,
        m: &Module,
        values: &[Option<MlirValue<'c, 'a>>],
    ) -> Result<melior::ir::Operation<'c>, EmitError> {
        let loc = self.loc(op.loc());
        let node = op.loc().node.as_str();
        let operands: Vec<MlirValue> = op
            .operands()
            .iter()
            .map(|v| values[v.index()].expect("operands are defined first"))
            .collect();
        let result_types = op
            .results()
            .iter()
            .map(|&r| self.ty(f.ty(r)))
            .collect::<Result<Vec<_>, _>>()?;
        let (name, attrs, regions) = match op.kind() {
            OpKind::While { .. } | OpKind::Case { .. } => self.control_flow(op, m, &operands)?,
            OpKind::Call { callee, .. } => {
                let symbol = self.symbol(callee, node)?;
                ("func.call", vec![("callee", format!("@{symbol}"))], vec![])
            }
            OpKind::Foreign(function) => {
                let symbol = self.callees.foreign_symbol(function).ok_or_else(|| {
                    EmitError::Invalid(format!("(at {node}) a kernel's function not found"))
                })?;
                ("func.call", vec![("callee", format!("@{symbol}"))], vec![])
            }
            OpKind::Composite {
                name,
                attributes,
                version,
                decomposition,
            } => {
                let symbol = self.symbol(decomposition, node)?;
                let each: Vec<String> = attributes
                    .iter()
                    .map(|(k, v)| format!("{k} = {}", v.mlir()))
                    .collect();
                // `version` without regions: composite_v1, which older plugins read too.
                (
                    "stablehlo.composite",
                    vec![
                        ("name", format!("{name:?}")),
                        ("composite_attributes", format!("{{{}}}", each.join(", "))),
                        ("decomposition", format!("@{symbol}")),
                        ("version", format!("{version} : i32")),
                    ],
                    vec![],
                )
            }
            _ => self.describe(op, f, m.sharding.as_ref(), m.manual)?,
        };
        let attrs = attrs
            .into_iter()
            .map(|(k, v)| Ok((Identifier::new(self.ctx, k), self.attr(&v, node)?)))
            .collect::<Result<Vec<_>, EmitError>>()?;
        // A branch reads the `case`'s other operands from the enclosing block: the op itself
        // takes only the index.
        let taken = match op.kind() {
            OpKind::Case { .. } => &operands[..1],
            _ => &operands[..],
        };
        OperationBuilder::new(name, loc)
            .add_operands(taken)
            .add_results(&result_types)
            .add_attributes(&attrs)
            .add_regions_vec(regions)
            .build()
            .map_err(|e| EmitError::Build {
                op: name.to_string(),
                node: node.to_string(),
                message: e.to_string(),
            })
    }

    /// The op's name, attributes (as MLIR text) and regions.
    #[allow(clippy::type_complexity)]
    fn describe(
        &mut self,
        op: &Op,
        f: &Func,
        sharding: Option<&MeshSharding>,
        manual: bool,
    ) -> Result<(&'static str, Vec<(&'static str, String)>, Vec<Region<'c>>), EmitError> {
        let operand_elem = |i: usize| f.ty(op.operands()[i]).elem;
        let loc = op.loc();
        if op.kind().is_collective() && !manual {
            return Err(EmitError::Invalid(format!(
                "a collective (at {}) in a module that does not run per device",
                loc.node
            )));
        }
        Ok(match op.kind() {
            OpKind::Constant(lit) => (
                "stablehlo.constant",
                vec![("value", literal_attr(lit))],
                vec![],
            ),
            OpKind::Iota { dim, .. } => (
                "stablehlo.iota",
                vec![("iota_dimension", format!("{dim} : i64"))],
                vec![],
            ),
            OpKind::Unary(u) => (u.op_name(), vec![], vec![]),
            OpKind::Binary(b) => (b.op_name(), vec![], vec![]),
            OpKind::Compare { dir, compare } => (
                "stablehlo.compare",
                vec![
                    (
                        "comparison_direction",
                        format!("#stablehlo<comparison_direction {}>", dir.mnemonic()),
                    ),
                    (
                        "compare_type",
                        format!("#stablehlo<comparison_type {}>", compare.mnemonic()),
                    ),
                ],
                vec![],
            ),
            OpKind::Select => ("stablehlo.select", vec![], vec![]),
            OpKind::Clamp => ("stablehlo.clamp", vec![], vec![]),
            OpKind::Convert { .. } => ("stablehlo.convert", vec![], vec![]),
            OpKind::IsFinite => ("stablehlo.is_finite", vec![], vec![]),
            OpKind::BitcastConvert { .. } => ("stablehlo.bitcast_convert", vec![], vec![]),
            OpKind::OptimizationBarrier => ("stablehlo.optimization_barrier", vec![], vec![]),
            OpKind::Cholesky { lower } => (
                "stablehlo.cholesky",
                vec![("lower", lower.to_string())],
                vec![],
            ),
            OpKind::TriangularSolve {
                left_side,
                lower,
                unit_diagonal,
                transpose,
            } => (
                "stablehlo.triangular_solve",
                vec![
                    ("left_side", left_side.to_string()),
                    ("lower", lower.to_string()),
                    ("unit_diagonal", unit_diagonal.to_string()),
                    (
                        "transpose_a",
                        format!("#stablehlo<transpose {}>", transpose.mnemonic()),
                    ),
                ],
                vec![],
            ),
            OpKind::CustomCall { target, config, .. } => (
                "stablehlo.custom_call",
                vec![
                    ("call_target_name", format!("{target:?}")),
                    ("backend_config", format!("{config:?}")),
                ],
                vec![],
            ),
            OpKind::BroadcastInDim { dims, .. } => (
                "stablehlo.broadcast_in_dim",
                vec![("broadcast_dimensions", array_i64(dims))],
                vec![],
            ),
            OpKind::Reshape { .. } => ("stablehlo.reshape", vec![], vec![]),
            OpKind::Transpose { perm } => (
                "stablehlo.transpose",
                vec![("permutation", array_i64(perm))],
                vec![],
            ),
            OpKind::Slice {
                start,
                limit,
                strides,
            } => (
                "stablehlo.slice",
                vec![
                    ("start_indices", array_i64(start)),
                    ("limit_indices", array_i64(limit)),
                    ("strides", array_i64(strides)),
                ],
                vec![],
            ),
            OpKind::Concatenate { dim } => (
                "stablehlo.concatenate",
                vec![("dimension", format!("{dim} : i64"))],
                vec![],
            ),
            OpKind::Pad {
                low,
                high,
                interior,
            } => (
                "stablehlo.pad",
                vec![
                    ("edge_padding_low", array_i64(low)),
                    ("edge_padding_high", array_i64(high)),
                    ("interior_padding", array_i64(interior)),
                ],
                vec![],
            ),
            OpKind::DynamicUpdateSlice => ("stablehlo.dynamic_update_slice", vec![], vec![]),
            OpKind::DynamicSlice { sizes } => (
                "stablehlo.dynamic_slice",
                vec![("slice_sizes", array_i64(sizes))],
                vec![],
            ),
            OpKind::Reverse { dims } => (
                "stablehlo.reverse",
                vec![("dimensions", array_i64(dims))],
                vec![],
            ),
            OpKind::DotGeneral { dims, precision } => {
                let mut parts = Vec::new();
                for (k, v) in [
                    ("lhs_batching_dimensions", &dims.lhs_batch),
                    ("rhs_batching_dimensions", &dims.rhs_batch),
                    ("lhs_contracting_dimensions", &dims.lhs_contracting),
                    ("rhs_contracting_dimensions", &dims.rhs_contracting),
                ] {
                    if !v.is_empty() {
                        parts.push(format!("{k} = [{}]", dims_list(v)));
                    }
                }
                (
                    "stablehlo.dot_general",
                    vec![
                        (
                            "dot_dimension_numbers",
                            format!("#stablehlo.dot<{}>", parts.join(", ")),
                        ),
                        ("precision_config", precision_attr(*precision)),
                    ],
                    vec![],
                )
            }
            OpKind::Convolution(c) => {
                let spatial: Vec<String> = (0..c.strides.len()).map(|i| i.to_string()).collect();
                let s = spatial.join(", ");
                let kernel = match c.kernel {
                    KernelLayout::OutInSpatial => format!("o, i, {s}"),
                    KernelLayout::SpatialInOut => format!("{s}, i, o"),
                };
                (
                    "stablehlo.convolution",
                    vec![
                        ("window_strides", array_i64(&c.strides)),
                        ("padding", padding_attr(&c.padding)),
                        ("lhs_dilation", array_i64(&c.lhs_dilation)),
                        ("rhs_dilation", array_i64(&c.rhs_dilation)),
                        (
                            "dimension_numbers",
                            format!("#stablehlo.conv<[b, f, {s}]x[{kernel}]->[b, f, {s}]>"),
                        ),
                        ("feature_group_count", format!("{} : i64", c.groups)),
                        ("batch_group_count", format!("{} : i64", c.batch_groups)),
                        ("precision_config", precision_attr(c.precision)),
                    ],
                    vec![],
                )
            }
            OpKind::Reduce { dims, body } => {
                let elems: Vec<DType> = op.results().iter().map(|&r| f.ty(r).elem).collect();
                (
                    "stablehlo.reduce",
                    vec![("dimensions", array_i64(dims))],
                    vec![self.reduce_body(*body, &elems, loc)?],
                )
            }
            OpKind::ReduceWindow {
                window,
                strides,
                padding,
                body,
            } => (
                "stablehlo.reduce_window",
                vec![
                    ("window_dimensions", array_i64(window)),
                    ("window_strides", array_i64(strides)),
                    ("padding", padding_attr(padding)),
                ],
                vec![self.reduce_body(*body, &[operand_elem(0)], loc)?],
            ),
            OpKind::Gather(g) => {
                let mut parts = vec![format!("offset_dims = [{}]", dims_list(&g.offset_dims))];
                for (k, v) in [
                    ("collapsed_slice_dims", &g.collapsed_slice_dims),
                    ("operand_batching_dims", &g.operand_batching_dims),
                    (
                        "start_indices_batching_dims",
                        &g.start_indices_batching_dims,
                    ),
                ] {
                    if !v.is_empty() {
                        parts.push(format!("{k} = [{}]", dims_list(v)));
                    }
                }
                parts.push(format!(
                    "start_index_map = [{}]",
                    dims_list(&g.start_index_map)
                ));
                parts.push(format!("index_vector_dim = {}", g.index_vector_dim));
                (
                    "stablehlo.gather",
                    vec![
                        (
                            "dimension_numbers",
                            format!("#stablehlo.gather<{}>", parts.join(", ")),
                        ),
                        ("slice_sizes", array_i64(&g.slice_sizes)),
                        ("indices_are_sorted", "false".into()),
                    ],
                    vec![],
                )
            }
            OpKind::Scatter { dims, mode } => {
                let mut parts = vec![format!(
                    "update_window_dims = [{}]",
                    dims_list(&dims.update_window_dims)
                )];
                for (k, v) in [
                    ("inserted_window_dims", &dims.inserted_window_dims),
                    ("input_batching_dims", &dims.input_batching_dims),
                    (
                        "scatter_indices_batching_dims",
                        &dims.scatter_indices_batching_dims,
                    ),
                ] {
                    if !v.is_empty() {
                        parts.push(format!("{k} = [{}]", dims_list(v)));
                    }
                }
                parts.push(format!(
                    "scatter_dims_to_operand_dims = [{}]",
                    dims_list(&dims.scatter_dims_to_operand_dims)
                ));
                parts.push(format!("index_vector_dim = {}", dims.index_vector_dim));
                let region = self.scatter_body(*mode, operand_elem(0), loc)?;
                (
                    "stablehlo.scatter",
                    vec![
                        (
                            "scatter_dimension_numbers",
                            format!("#stablehlo.scatter<{}>", parts.join(", ")),
                        ),
                        ("indices_are_sorted", "false".into()),
                        ("unique_indices", "false".into()),
                    ],
                    vec![region],
                )
            }
            OpKind::Sort {
                dim,
                order,
                compare,
            } => {
                let elems: Vec<DType> = op.operands().iter().map(|&v| f.ty(v).elem).collect();
                (
                    "stablehlo.sort",
                    vec![
                        ("dimension", format!("{dim} : i64")),
                        ("is_stable", "true".into()),
                    ],
                    vec![self.sort_body(*order, *compare, &elems, loc)?],
                )
            }
            OpKind::RngBitGenerator { .. } => (
                "stablehlo.rng_bit_generator",
                vec![(
                    "rng_algorithm",
                    "#stablehlo<rng_algorithm THREE_FRY>".into(),
                )],
                vec![],
            ),
            OpKind::Real => ("stablehlo.real", vec![], vec![]),
            OpKind::Imag => ("stablehlo.imag", vec![], vec![]),
            OpKind::Complex => ("stablehlo.complex", vec![], vec![]),
            OpKind::Fft { kind, length } => (
                "stablehlo.fft",
                vec![
                    (
                        "fft_type",
                        format!("#stablehlo<fft_type {}>", kind.mnemonic()),
                    ),
                    ("fft_length", array_i64(length)),
                ],
                vec![],
            ),
            OpKind::AllReduce { op: reduce, groups } => {
                let attrs = self.collective_attrs(groups, true);
                let body = ReduceBody::Binary(*reduce);
                (
                    "stablehlo.all_reduce",
                    attrs,
                    vec![self.reduce_body(body, &[operand_elem(0)], loc)?],
                )
            }
            OpKind::AllGather { dim, groups } => {
                let mut attrs = self.collective_attrs(groups, true);
                attrs.push(("all_gather_dim", format!("{dim} : i64")));
                ("stablehlo.all_gather", attrs, vec![])
            }
            OpKind::ReduceScatter {
                dim,
                op: reduce,
                groups,
            } => {
                let mut attrs = self.collective_attrs(groups, true);
                attrs.push(("scatter_dimension", format!("{dim} : i64")));
                let body = ReduceBody::Binary(*reduce);
                (
                    "stablehlo.reduce_scatter",
                    attrs,
                    vec![self.reduce_body(body, &[operand_elem(0)], loc)?],
                )
            }
            OpKind::AllToAll {
                split_dim,
                concat_dim,
                groups,
            } => {
                // all_to_all has no use_global_device_ids: with a channel, its groups name
                // partitions, which are the devices' ids here (one replica).
                let mut attrs = self.collective_attrs(groups, false);
                let count = groups.first().map_or(0, Vec::len);
                attrs.extend([
                    ("split_dimension", format!("{split_dim} : i64")),
                    ("concat_dimension", format!("{concat_dim} : i64")),
                    ("split_count", format!("{count} : i64")),
                ]);
                ("stablehlo.all_to_all", attrs, vec![])
            }
            OpKind::While { .. }
            | OpKind::Case { .. }
            | OpKind::Call { .. }
            | OpKind::Composite { .. }
            | OpKind::Foreign(_) => {
                return Err(EmitError::Invalid(format!(
                    "{} (at {}) calls a function: `op` emits it",
                    op.kind().name(),
                    loc.node
                )))
            }
            OpKind::ShardingConstraint(s) => {
                let Some(mesh) = sharding else {
                    return Err(EmitError::Invalid(format!(
                        "a sharding constraint (at {}) in a module without a mesh",
                        loc.node
                    )));
                };
                let (key, text) = sharding_attr(mesh, s);
                match mesh.dialect {
                    ShardingDialect::Shardy => {
                        ("sdy.sharding_constraint", vec![("sharding", text)], vec![])
                    }
                    ShardingDialect::Gspmd => (
                        "stablehlo.custom_call",
                        vec![("call_target_name", "\"Sharding\"".into()), (key, text)],
                        vec![],
                    ),
                }
            }
        })
    }

    /// A loop or a choice: its name and its regions, each a function of the IR emitted as a
    /// block. A loop's blocks take the carried values as arguments; a branch's block takes none
    /// (as StableHLO's `case` has it) and reads the op's operands after the index where the
    /// branch's function reads its arguments.
    #[allow(clippy::type_complexity)]
    fn control_flow(
        &mut self,
        op: &Op,
        m: &Module,
        operands: &[MlirValue<'c, '_>],
    ) -> Result<(&'static str, Vec<(&'static str, String)>, Vec<Region<'c>>), EmitError> {
        let unknown = Location::unknown(self.ctx);
        let is_loop = matches!(op.kind(), OpKind::While { .. });
        let mut regions = Vec::new();
        for r in op.kind().regions() {
            let f = r.func();
            let region = Region::new();
            let block = if is_loop {
                let types = f
                    .args()
                    .iter()
                    .map(|&a| Ok((self.ty(f.ty(a))?, unknown)))
                    .collect::<Result<Vec<_>, EmitError>>()?;
                region.append_block(Block::new(&types))
            } else {
                region.append_block(Block::new(&[]))
            };
            let args: Vec<MlirValue> = if is_loop {
                (0..f.args().len())
                    .map(|i| block.argument(i).expect("argument exists").into())
                    .collect()
            } else {
                // SAFETY: the operands are values of the block the op is appended to, which
                // encloses this region and outlives every op in it.
                operands[1..]
                    .iter()
                    .map(|v| unsafe { MlirValue::from_raw(v.to_raw()) })
                    .collect()
            };
            let results = self.func_body(f, m, block, args)?;
            block.append_operation(build("stablehlo.return", unknown, &results)?);
            regions.push(region);
        }
        Ok((op.kind().name(), vec![], regions))
    }

    /// A region with one block of scalar arguments; `build` appends ops and returns results.
    fn scalar_region<F>(
        &mut self,
        arg_elems: &[DType],
        loc: &Arc<Loc>,
        build: F,
    ) -> Result<Region<'c>, EmitError>
    where
        F: for<'b> FnOnce(
            &mut BodyBuilder<'c, 'b, '_>,
            Vec<MlirValue<'c, 'b>>,
        ) -> Result<Vec<MlirValue<'c, 'b>>, EmitError>,
    {
        let l = self.loc(loc);
        let types = arg_elems
            .iter()
            .map(|&e| self.ty(&TensorType::scalar(e)))
            .collect::<Result<Vec<_>, _>>()?;
        let region = Region::new();
        let block = region.append_block(Block::new(
            &types.iter().map(|&t| (t, l)).collect::<Vec<_>>(),
        ));
        let args: Vec<MlirValue> = (0..types.len())
            .map(|i| block.argument(i).expect("exists").into())
            .collect();
        let mut b = BodyBuilder {
            e: self,
            block,
            loc: l,
        };
        let results = build(&mut b, args)?;
        b.terminate(&results)?;
        Ok(region)
    }

    fn reduce_body(
        &mut self,
        body: ReduceBody,
        elems: &[DType],
        loc: &Arc<Loc>,
    ) -> Result<Region<'c>, EmitError> {
        match body {
            ReduceBody::Binary(op) => {
                let e = elems[0];
                self.scalar_region(&[e, e], loc, |b, a| {
                    Ok(vec![b.op(op.op_name(), &[a[0], a[1]], &[], e)?])
                })
            }
            ReduceBody::ArgExtremum { largest, nan_wins } => {
                let (v, i) = (elems[0], elems[1]);
                let dir = if largest {
                    CompareDir::Gt
                } else {
                    CompareDir::Lt
                };
                self.scalar_region(&[v, i, v, i], loc, |b, a| {
                    let (acc_v, acc_i, x_v, x_i) = (a[0], a[1], a[2], a[3]);
                    let better = b.compare(dir, x_v, acc_v, v)?;
                    let equal = b.compare(CompareDir::Eq, x_v, acc_v, v)?;
                    let earlier = b.compare(CompareDir::Lt, x_i, acc_i, i)?;
                    let (better, equal) = if nan_wins {
                        // NaN beats every number; among NaNs the first index wins.
                        let x_nan = b.compare(CompareDir::Ne, x_v, x_v, v)?;
                        let acc_nan = b.compare(CompareDir::Ne, acc_v, acc_v, v)?;
                        let acc_num = b.op("stablehlo.not", &[acc_nan], &[], DType::Bool)?;
                        let nan_over_num =
                            b.op("stablehlo.and", &[x_nan, acc_num], &[], DType::Bool)?;
                        let both_nan =
                            b.op("stablehlo.and", &[x_nan, acc_nan], &[], DType::Bool)?;
                        (
                            b.op("stablehlo.or", &[better, nan_over_num], &[], DType::Bool)?,
                            b.op("stablehlo.or", &[equal, both_nan], &[], DType::Bool)?,
                        )
                    } else {
                        (better, equal)
                    };
                    let tie = b.op("stablehlo.and", &[equal, earlier], &[], DType::Bool)?;
                    let take = b.op("stablehlo.or", &[better, tie], &[], DType::Bool)?;
                    let rv = b.op("stablehlo.select", &[take, x_v, acc_v], &[], v)?;
                    let ri = b.op("stablehlo.select", &[take, x_i, acc_i], &[], i)?;
                    Ok(vec![rv, ri])
                })
            }
        }
    }

    fn scatter_body(
        &mut self,
        mode: ScatterMode,
        e: DType,
        loc: &Arc<Loc>,
    ) -> Result<Region<'c>, EmitError> {
        self.scalar_region(&[e, e], loc, |b, a| match mode {
            ScatterMode::Replace => Ok(vec![a[1]]),
            ScatterMode::Combine(op) => Ok(vec![b.op(op.op_name(), &[a[0], a[1]], &[], e)?]),
        })
    }

    fn sort_body(
        &mut self,
        order: SortOrder,
        compare: CompareType,
        elems: &[DType],
        loc: &Arc<Loc>,
    ) -> Result<Region<'c>, EmitError> {
        let args: Vec<DType> = elems.iter().flat_map(|&e| [e, e]).collect();
        self.scalar_region(&args, loc, |b, a| {
            let dir = match order {
                SortOrder::Ascending => "LT",
                SortOrder::Descending => "GT",
            };
            let r = b.op(
                "stablehlo.compare",
                &[a[0], a[1]],
                &[
                    (
                        "comparison_direction",
                        format!("#stablehlo<comparison_direction {dir}>"),
                    ),
                    (
                        "compare_type",
                        format!("#stablehlo<comparison_type {}>", compare.mnemonic()),
                    ),
                ],
                DType::Bool,
            )?;
            Ok(vec![r])
        })
    }
}

struct BodyBuilder<'c, 'b, 'e> {
    e: &'e mut Emitter<'c>,
    block: BlockRef<'c, 'b>,
    loc: Location<'c>,
}

impl<'c, 'b> BodyBuilder<'c, 'b, '_> {
    fn append(
        &mut self,
        name: &str,
        operands: &[MlirValue<'c, 'b>],
        attrs: &[(&str, String)],
        results: &[DType],
    ) -> Result<melior::ir::OperationRef<'c, 'b>, EmitError> {
        let types = results
            .iter()
            .map(|&e| self.e.ty(&TensorType::scalar(e)))
            .collect::<Result<Vec<_>, _>>()?;
        let attrs = attrs
            .iter()
            .map(|(k, v)| Ok((Identifier::new(self.e.ctx, k), self.e.attr(v, "region")?)))
            .collect::<Result<Vec<_>, EmitError>>()?;
        let op = OperationBuilder::new(name, self.loc)
            .add_operands(operands)
            .add_results(&types)
            .add_attributes(&attrs)
            .build()
            .map_err(|e| EmitError::Build {
                op: name.to_string(),
                node: String::new(),
                message: e.to_string(),
            })?;
        Ok(self.block.append_operation(op))
    }

    /// Appends an op with one scalar result of `result` and returns that result.
    fn op(
        &mut self,
        name: &str,
        operands: &[MlirValue<'c, 'b>],
        attrs: &[(&str, String)],
        result: DType,
    ) -> Result<MlirValue<'c, 'b>, EmitError> {
        let r = self.append(name, operands, attrs, &[result])?;
        Ok(r.result(0).expect("result exists").into())
    }

    /// Ends the region with `stablehlo.return`.
    fn terminate(&mut self, results: &[MlirValue<'c, 'b>]) -> Result<(), EmitError> {
        self.append("stablehlo.return", results, &[], &[])
            .map(|_| ())
    }

    fn compare(
        &mut self,
        dir: CompareDir,
        a: MlirValue<'c, 'b>,
        b: MlirValue<'c, 'b>,
        elem: DType,
    ) -> Result<MlirValue<'c, 'b>, EmitError> {
        self.op(
            "stablehlo.compare",
            &[a, b],
            &[
                (
                    "comparison_direction",
                    format!("#stablehlo<comparison_direction {}>", dir.mnemonic()),
                ),
                (
                    "compare_type",
                    format!(
                        "#stablehlo<comparison_type {}>",
                        CompareType::of(elem).mnemonic()
                    ),
                ),
            ],
            DType::Bool,
        )
    }
}

/// `dense<...> : tensor<...>` for a literal. Splats print one value; other tensors print their
/// raw bytes in hex (booleans as a nested list, since MLIR packs i1 differently).
pub fn literal_attr(lit: &Literal) -> String {
    let ty = &lit.ty;
    // Complex elements go as raw bytes too; a buffer of one element is MLIR's splat form.
    if lit.splat && !ty.elem.is_complex() {
        return format!("dense<{}> : {ty}", scalar_text(ty.elem, &lit.bytes));
    }
    if ty.elem == DType::Bool {
        let mut s = String::new();
        nested_bools(&mut s, &ty.shape, &lit.bytes);
        return format!("dense<{s}> : {ty}");
    }
    let mut hex = String::with_capacity(lit.bytes.len() * 2 + 2);
    hex.push_str("0x");
    for b in lit.bytes.iter() {
        let _ = write!(hex, "{b:02X}");
    }
    format!("dense<\"{hex}\"> : {ty}")
}

fn nested_bools(out: &mut String, shape: &[i64], bytes: &[u8]) {
    if shape.is_empty() {
        out.push_str(if bytes[0] != 0 { "true" } else { "false" });
        return;
    }
    let inner: i64 = shape[1..].iter().product();
    out.push('[');
    for i in 0..shape[0] {
        if i > 0 {
            out.push_str(", ");
        }
        let start = (i * inner) as usize;
        nested_bools(out, &shape[1..], &bytes[start..start + inner as usize]);
    }
    out.push(']');
}

/// The symbol of a module's Shardy mesh.
const MESH: &str = "mesh";

/// `#sdy.mesh<["dp"=2, "tp"=2]>`.
fn shardy_mesh(mesh: &Mesh) -> String {
    let axes: Vec<String> = mesh
        .axes
        .iter()
        .map(|a| format!("\"{}\"={}", a.name, a.size))
        .collect();
    format!("#sdy.mesh<[{}]>", axes.join(", "))
}

/// The attribute (name and value) laying a value out over `mesh` in its dialect.
fn sharding_attr(mesh: &MeshSharding, sharding: &Sharding) -> (&'static str, String) {
    match mesh.dialect {
        ShardingDialect::Shardy => ("sdy.sharding", shardy_sharding(sharding)),
        ShardingDialect::Gspmd => (
            "mhlo.sharding",
            format!("\"{}\"", gspmd_sharding(&mesh.mesh, sharding)),
        ),
    }
}

/// `#sdy.sharding<@mesh, [{"dp"}, {}]>`.
fn shardy_sharding(sharding: &Sharding) -> String {
    format!("#sdy.sharding<@{MESH}, {}>", shardy_dims(sharding))
}

/// `[{"dp"}, {}]`: the axes of each dimension.
fn shardy_dims(sharding: &Sharding) -> String {
    let dims: Vec<String> = sharding
        .dims
        .iter()
        .map(|axes| {
            let names: Vec<String> = axes.iter().map(|a| format!("\"{a}\"")).collect();
            format!("{{{}}}", names.join(", "))
        })
        .collect();
    format!("[{}]", dims.join(", "))
}

/// An op of `name` taking `operands` and returning nothing (a terminator).
fn build<'c>(
    name: &str,
    loc: Location<'c>,
    operands: &[MlirValue<'c, '_>],
) -> Result<melior::ir::Operation<'c>, EmitError> {
    OperationBuilder::new(name, loc)
        .add_operands(operands)
        .build()
        .map_err(|e| EmitError::Build {
            op: name.into(),
            node: String::new(),
            message: e.to_string(),
        })
}

/// GSPMD's text for `sharding` over `mesh`: `{replicated}`, or the tiles per dimension and the
/// devices in tile order as an iota over the mesh, transposed when the tensor's dimensions take
/// the axes in another order (`{devices=[2,1,2]<=[2,2]T(1,0) last_tile_dim_replicate}`).
pub fn gspmd_sharding(mesh: &Mesh, sharding: &Sharding) -> String {
    if sharding.is_replicated() {
        return "{replicated}".into();
    }
    let index = |name: &str| mesh.axis(name).map(|(i, _)| i);
    let mut order: Vec<usize> = Vec::new();
    let mut tiles: Vec<i64> = Vec::new();
    for axes in &sharding.dims {
        let mut tile = 1;
        for a in axes {
            if let Some(i) = index(a) {
                order.push(i);
                tile *= mesh.axes[i].size;
            }
        }
        tiles.push(tile);
    }
    let unused: Vec<usize> = (0..mesh.axes.len())
        .filter(|i| !order.contains(i))
        .collect();
    let replicas: i64 = unused.iter().map(|&i| mesh.axes[i].size).product();
    order.extend(&unused);
    if replicas > 1 {
        tiles.push(replicas);
    }
    let list = |v: &[String]| v.join(",");
    let tiles: Vec<String> = tiles.iter().map(i64::to_string).collect();
    let devices = if order.iter().enumerate().all(|(i, &o)| i == o) {
        format!("<=[{}]", mesh.devices())
    } else {
        let sizes: Vec<String> = mesh.axes.iter().map(|a| a.size.to_string()).collect();
        let perm: Vec<String> = order.iter().map(usize::to_string).collect();
        format!("<=[{}]T({})", list(&sizes), list(&perm))
    };
    let replicate = if replicas > 1 {
        " last_tile_dim_replicate"
    } else {
        ""
    };
    format!("{{devices=[{}]{devices}{replicate}}}", list(&tiles))
}
