//! Functions written outside tpuc (a user's kernel, `OpKind::Foreign`) spliced into the module:
//! the kernel's module is parsed, its functions renamed after the symbol tpuc gave the kernel
//! (its `main` takes the symbol itself, the others `symbol__name`, every use inside renamed
//! with them), made private, and copied into the module.

use std::cell::RefCell;
use std::collections::HashSet;

use melior::ir::attribute::{StringAttribute, TypeAttribute};
use melior::ir::block::BlockLike;
use melior::ir::operation::{OperationLike, OperationMutLike};
use melior::ir::r#type::FunctionType;
use melior::ir::{Attribute, Module as MlirModule, Operation, Type};
use melior::{Context, StringRef};

use tpuc_hlo::ir::{ForeignFunction, TensorType};

use crate::EmitError;

/// Copies the functions of `function`'s module into `into`, its `main` as `symbol`; `taken`:
/// the symbols the module has, which the copies must not take.
pub(crate) fn splice<'c>(
    ctx: &'c Context,
    into: &MlirModule<'c>,
    symbol: &str,
    function: &ForeignFunction,
    taken: &mut HashSet<String>,
    ty: &mut dyn FnMut(&TensorType) -> Result<Type<'c>, EmitError>,
) -> Result<(), EmitError> {
    let fail = |message: String| EmitError::Kernel {
        name: function.name.clone(),
        message,
    };
    let parsed = parse(ctx, &function.module).map_err(&fail)?;
    let body = parsed.body();
    let mut names = Vec::new();
    let mut op = body.first_operation();
    while let Some(current) = op {
        let kind = current
            .name()
            .as_string_ref()
            .as_str()
            .unwrap_or("?")
            .to_string();
        if kind != "func.func" {
            return Err(fail(format!(
                "its module holds a {kind}; a kernel's module may hold functions only"
            )));
        }
        let name = current
            .attribute("sym_name")
            .ok()
            .and_then(|a| StringAttribute::try_from(a).ok())
            .map(|a| a.value().to_string())
            .ok_or_else(|| fail("a function without a name".into()))?;
        names.push(name);
        op = current.next_in_block();
    }
    if !names.iter().any(|n| n == "main") {
        return Err(fail("its module has no function main".into()));
    }
    // `main` must have the op's signature.
    let operands = function
        .operands
        .iter()
        .map(&mut *ty)
        .collect::<Result<Vec<_>, _>>()?;
    let results = function
        .results
        .iter()
        .map(&mut *ty)
        .collect::<Result<Vec<_>, _>>()?;
    let wanted: Attribute =
        TypeAttribute::new(FunctionType::new(ctx, &operands, &results).into()).into();
    let main = find(&parsed, "main").expect("main was found above");
    let found = main
        .attribute("function_type")
        .map_err(|_| fail("its main has no function type".into()))?;
    if found != wanted {
        return Err(fail(format!(
            "its main is {found}, the op needs {wanted} (was the kernel made for other shapes?)"
        )));
    }
    // Renamed in two steps, through names no module has, so that no new name is an old one.
    let finals: Vec<String> = names
        .iter()
        .map(|n| {
            if n == "main" {
                symbol.to_string()
            } else {
                format!("{symbol}__{n}")
            }
        })
        .collect();
    for name in &finals {
        if !taken.insert(name.clone()) {
            return Err(fail(format!(
                "its function {name} would take a name the module has"
            )));
        }
    }
    let interim: Vec<String> = (0..names.len())
        .map(|i| format!("tpuc kernel {i}"))
        .collect();
    for (from, to) in names
        .iter()
        .zip(&interim)
        .chain(interim.iter().zip(&finals))
    {
        rename(ctx, &parsed, from, to).map_err(&fail)?;
    }
    for name in &finals {
        let mut op = find(&parsed, name).expect("renamed above");
        op.set_attribute(
            "sym_visibility",
            StringAttribute::new(ctx, "private").into(),
        );
        // SAFETY: a copy of a live operation, owned by the `Operation` made of it.
        let copy = unsafe { Operation::from_raw(mlir_sys::mlirOperationClone(op.to_raw())) };
        into.body().append_operation(copy);
    }
    Ok(())
}

/// `text` parsed, or MLIR's diagnostics.
fn parse<'c>(ctx: &'c Context, text: &str) -> Result<MlirModule<'c>, String> {
    let said = RefCell::new(Vec::new());
    let handler = ctx.attach_diagnostic_handler(|d| {
        said.borrow_mut().push(d.to_string());
        true
    });
    let parsed = MlirModule::parse(ctx, text);
    ctx.detach_diagnostic_handler(handler);
    parsed.ok_or_else(|| {
        format!(
            "its module does not parse ({}); a kernel's module is MLIR in generic form",
            said.borrow().join("; ")
        )
    })
}

/// The function `name` of `module`.
fn find<'c, 'a>(
    module: &'a MlirModule<'c>,
    name: &str,
) -> Option<melior::ir::operation::OperationRefMut<'c, 'a>> {
    let mut op = module.body().first_operation_mut();
    while let Some(current) = op {
        let named = current
            .attribute("sym_name")
            .ok()
            .and_then(|a| StringAttribute::try_from(a).ok())
            .is_some_and(|a| a.value() == name);
        if named {
            return Some(current);
        }
        op = current.next_in_block_mut();
    }
    None
}

/// Renames function `from` of `module` to `to`, with every use of it in the module.
fn rename(ctx: &Context, module: &MlirModule, from: &str, to: &str) -> Result<(), String> {
    let (old, new) = (StringRef::new(from), StringRef::new(to));
    // SAFETY: plain C calls on live MLIR objects; the strings outlive them.
    let replaced = unsafe {
        mlir_sys::mlirSymbolTableReplaceAllSymbolUses(
            old.to_raw(),
            new.to_raw(),
            module.as_operation().to_raw(),
        )
    };
    if replaced.value == 0 {
        return Err(format!("its uses of function {from} could not be renamed"));
    }
    let mut op = find(module, from).ok_or_else(|| format!("no function {from}"))?;
    op.set_attribute("sym_name", StringAttribute::new(ctx, to).into());
    Ok(())
}
