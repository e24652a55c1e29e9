//! Passes over the IR, and the one order they run in: [`pipeline`].

pub mod bool_constants;
pub mod canonicalize;
pub mod dead_code;
pub mod donation;
pub mod exact_division;
pub mod fold;
pub mod fusion;
pub mod hoist;
pub mod narrow_arithmetic;
pub mod sharding;

use crate::ir::{verify, Mesh, Module, Sharding, VerifyError};

pub use fusion::Fusion;
pub use hoist::HoistRequest;
pub use sharding::ShardingRequest;

/// What the pipeline does beyond cleaning up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PipelineOptions {
    /// Split off what the stable arguments alone determine (see [`hoist`]).
    pub hoist: Option<HoistRequest>,
    /// Lay the module out over devices (see [`sharding`] and `crate::plan`).
    pub sharding: Option<ShardingRequest>,
    /// Run the module, one device's program, on every device of this mesh (see
    /// [`sharding::per_device`]); not with `sharding` or `hoist`.
    pub per_device: Option<Mesh>,
    /// Arguments updated in place: (argument position, the result holding its new value); see
    /// [`donation`].
    pub donate: Vec<(usize, usize)>,
    /// Recognise named patterns as composites (see [`fusion`]).
    pub fusion: Fusion,
    /// Run the verifier before the first pass and after each (on in debug builds and tests).
    pub verify: bool,
}

impl Default for PipelineOptions {
    fn default() -> Self {
        PipelineOptions {
            hoist: None,
            sharding: None,
            per_device: None,
            donate: Vec::new(),
            fusion: Fusion::None,
            verify: cfg!(debug_assertions),
        }
    }
}

/// What the pipeline made of a module.
#[derive(Clone, Debug)]
pub struct Pipelined {
    /// The module to run: the original arguments, then one per result of `prepared`.
    pub main: Module,
    /// What was hoisted: a module computing values from the arguments at `reads`.
    pub prepared: Option<Prepared>,
}

#[derive(Clone, Debug)]
pub struct Prepared {
    pub module: Module,
    /// Positions, among the original module's arguments, of those the module reads.
    pub reads: Vec<usize>,
}

/// The passes, in order: constant folding, canonical forms of views, dead code, hoisting,
/// sharding (or making the module per device), updates in place, then the plugin's legalisations (narrow float
/// arithmetic in float32, exact divisions by constants, boolean constants). The verifier runs between
/// them when asked; an error names the pass after which the module broke.
pub fn pipeline(module: Module, options: &PipelineOptions) -> Result<Pipelined, VerifyError> {
    let check = |m: &Module, after: &str| -> Result<(), VerifyError> {
        if options.verify {
            verify(m).map_err(|e| e.after(after))?;
        }
        Ok(())
    };
    check(&module, "lowering")?;
    let module = everywhere(module, fold::fold_constants, "constant folding")?;
    check(&module, "constant folding")?;
    let module = everywhere(module, canonicalize::canonicalize, "canonical forms")?;
    check(&module, "canonical forms")?;
    let module = everywhere(module, dead_code::dead_code, "dead code")?;
    check(&module, "dead code")?;
    let module = if options.fusion.patterns() {
        let fuse = match options.fusion {
            Fusion::Kernels => fusion::fuse_with_kernels,
            _ => fusion::fuse,
        };
        let fused = everywhere(module, fuse, "fusion")?;
        check(&fused, "fusion")?;
        fused
    } else {
        module
    };
    if let Some(mesh) = &options.per_device {
        if options.sharding.is_some() || options.hoist.is_some() {
            return Err(VerifyError {
                place: "pipeline".into(),
                invariant: "a per-device program is neither laid out by a plan nor hoisted".into(),
                after: None,
            });
        }
        let main = sharding::per_device(module, mesh).map_err(|e| built(e, "per-device module"))?;
        check(&main, "making the module per device")?;
        let main = donation::donate(main, &options.donate)?;
        let main = for_the_plugin(main)?;
        check(&main, "the plugin's legalisations")?;
        return Ok(Pipelined {
            main,
            prepared: None,
        });
    }
    let (mut main, mut prepared) = match &options.hoist {
        Some(request) => hoist::hoist(module, request),
        None => (module, None),
    };
    check(&main, "hoisting")?;
    if let Some(request) = &options.sharding {
        main = sharding::annotate(main, request).map_err(|e| built(e, "sharding"))?;
        check(&main, "sharding")?;
        if let Some(p) = &mut prepared {
            // The prepared module reads the weights as `main` does; what it computes from them
            // is whole on every device.
            let read = ShardingRequest {
                args: p
                    .reads
                    .iter()
                    .zip(p.module.main.arg_types())
                    .map(|(&i, ty)| {
                        request
                            .args
                            .get(i)
                            .cloned()
                            .unwrap_or_else(|| Sharding::replicated(ty.rank()))
                    })
                    .collect(),
                results: Vec::new(),
                at_use: Vec::new(),
                ..request.clone()
            };
            p.module = sharding::annotate(std::mem::take(&mut p.module), &read)
                .map_err(|e| built(e, "sharding the prepared module"))?;
            check(&p.module, "sharding the prepared module")?;
        }
    }
    let main = donation::donate(main, &options.donate)?;
    let main = for_the_plugin(main)?;
    check(&main, "the plugin's legalisations")?;
    let prepared = match prepared {
        Some(p) => {
            let module = for_the_plugin(p.module)?;
            check(&module, "the plugin's legalisations of the prepared module")?;
            Some(Prepared {
                module,
                reads: p.reads,
            })
        }
        None => None,
    };
    Ok(Pipelined { main, prepared })
}

/// The last passes: what the plugin needs to compile the module as meant (narrow float
/// arithmetic computed in float32 and rounded explicitly, divisions by constants kept exact,
/// boolean constants it can parse).
fn for_the_plugin(module: Module) -> Result<Module, VerifyError> {
    let module = everywhere(
        module,
        narrow_arithmetic::arithmetic_in_float32,
        "narrow arithmetic",
    )?;
    let module = everywhere(module, exact_division::exact_division, "exact division")?;
    everywhere(
        module,
        bool_constants::bool_constants_as_bytes,
        "boolean constants",
    )
}

/// `pass`, a pass over one function (`main`), run on every function of `module`: the regions
/// of its ops, each as the `main` of a module like it, then `main`. The hoisting, sharding and
/// donation passes instead see an op with regions whole: what it computes from its operands.
fn everywhere(
    module: Module,
    pass: fn(Module) -> Module,
    name: &str,
) -> Result<Module, VerifyError> {
    let Module {
        main,
        sharding,
        manual,
    } = module;
    let main = main
        .map_regions(&mut |f| {
            pass(Module {
                main: f,
                sharding: sharding.clone(),
                manual,
            })
            .main
        })
        .map_err(|e| built(e, name).after(name))?;
    Ok(pass(Module {
        main,
        sharding,
        manual,
    }))
}

/// A pass that could not build what it meant to, as the pipeline reports it.
fn built(e: crate::ir::TypeError, place: &str) -> VerifyError {
    VerifyError {
        place: place.into(),
        invariant: e.to_string(),
        after: None,
    }
}
