//! What the op families share, imported by each family's file (`use super::prelude::*`): the
//! IR, the lowering context and its argument readers, torch's semantics several families use,
//! type promotion and the registry.

pub(super) use tpuc_fx::{Arg, DType, Dim};

pub(super) use super::ctx::{err, output_slots, Ctx, OpError, OpResult, Operand};
pub(super) use super::promote::promote_types;
pub(super) use super::registry::{scalar_overloads, LowerFn, Registry};
pub(super) use super::semantics::*;
pub(super) use crate::ir::*;
