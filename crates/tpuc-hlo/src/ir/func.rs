//! Functions and modules. A function's ops, values and their types change only through
//! [`super::Builder`], [`super::Rewriter`] and the checked edits here, so a function that
//! exists is well typed: every op's results have the types its rule gives.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::Arc;

use super::attrs::{ArgAttrs, MeshSharding};
use super::ops::{ForeignFunction, Loc, OpKind, Region, Value};
use super::types::TensorType;
use super::typing::infer;
use crate::ir::TypeError;

/// One op: what it computes, the values it reads and defines, and where it came from.
#[derive(Clone, Debug)]
pub struct Op {
    pub(super) kind: OpKind,
    pub(super) operands: Vec<Value>,
    pub(super) results: Vec<Value>,
    pub(super) loc: Arc<Loc>,
}

impl Op {
    pub fn kind(&self) -> &OpKind {
        &self.kind
    }

    pub fn operands(&self) -> &[Value] {
        &self.operands
    }

    pub fn results(&self) -> &[Value] {
        &self.results
    }

    /// The op's only result; None for ops with several.
    pub fn result(&self) -> Option<Value> {
        match self.results[..] {
            [r] => Some(r),
            _ => None,
        }
    }

    pub fn loc(&self) -> &Arc<Loc> {
        &self.loc
    }
}

/// The `main` function of a module: arguments, ops in order (SSA: each value defined once,
/// before its uses), results.
#[derive(Clone, Debug, Default)]
pub struct Func {
    pub(super) args: Vec<Value>,
    pub(super) arg_attrs: Vec<ArgAttrs>,
    pub(super) ops: Vec<Op>,
    pub(super) results: Vec<Value>,
    pub(super) result_attrs: Vec<ArgAttrs>,
    pub(super) types: Vec<TensorType>,
    /// The number of this function's first value: a region's values are numbered after those
    /// its enclosing function had when it was built, so that a value of one used in the other
    /// is caught (the verifier's "used before it is defined") rather than read as another.
    pub(super) first_value: u32,
}

impl Func {
    /// A function whose values are numbered from `first_value` on.
    pub(super) fn numbered_from(first_value: u32) -> Func {
        Func {
            first_value,
            ..Func::default()
        }
    }

    /// Whether `v` is numbered among this function's values.
    pub fn defines(&self, v: Value) -> bool {
        (self.first_value as usize..self.value_count()).contains(&v.index())
    }

    pub fn ty(&self, v: Value) -> &TensorType {
        let own = v
            .index()
            .checked_sub(self.first_value as usize)
            .and_then(|i| self.types.get(i));
        own.unwrap_or_else(|| panic!("%{} is not a value of this function", v.index()))
    }

    pub fn args(&self) -> &[Value] {
        &self.args
    }

    pub fn arg_attrs(&self) -> &[ArgAttrs] {
        &self.arg_attrs
    }

    pub fn ops(&self) -> &[Op] {
        &self.ops
    }

    pub fn results(&self) -> &[Value] {
        &self.results
    }

    pub fn result_attrs(&self) -> &[ArgAttrs] {
        &self.result_attrs
    }

    /// How many values the function has numbered (arguments and results of ops, including
    /// those of ops since removed).
    pub fn value_count(&self) -> usize {
        self.first_value as usize + self.types.len()
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

    pub fn arg_types(&self) -> Vec<TensorType> {
        self.args.iter().map(|&a| self.ty(a).clone()).collect()
    }

    pub fn result_types(&self) -> Vec<TensorType> {
        self.results.iter().map(|&r| self.ty(r).clone()).collect()
    }

    /// Makes op `index` compute `kind` from `operands` instead, defining the same values: its
    /// rule must give them the types they have.
    pub fn replace_op(
        &mut self,
        index: usize,
        kind: OpKind,
        operands: Vec<Value>,
    ) -> Result<(), TypeError> {
        let types: Vec<&TensorType> = operands.iter().map(|&v| self.ty(v)).collect();
        let fail = |message: String| TypeError {
            op: kind.name(),
            message,
        };
        let inferred = infer(&kind, &types).map_err(fail)?;
        let op = &self.ops[index];
        let current: Vec<&TensorType> = op.results.iter().map(|&r| self.ty(r)).collect();
        if inferred.iter().collect::<Vec<_>>() != current {
            return Err(fail(format!(
                "would change the result types of {} from {current:?} to {inferred:?}",
                op.kind.name()
            )));
        }
        let op = &mut self.ops[index];
        op.kind = kind;
        op.operands = operands;
        Ok(())
    }

    /// Keeps the ops for which `keep` says true, in order. Refused when a kept op or the
    /// function's results read a value a removed op defines.
    pub fn retain_ops(&mut self, keep: &[bool]) -> Result<(), String> {
        if keep.len() != self.ops.len() {
            return Err(format!("{} flags for {} ops", keep.len(), self.ops.len()));
        }
        let mut removed = vec![false; self.value_count()];
        for (op, &k) in self.ops.iter().zip(keep) {
            if !k {
                for r in &op.results {
                    removed[r.index()] = true;
                }
            }
        }
        let reads_removed = |v: &Value| removed[v.index()];
        if let Some((op, _)) = self
            .ops
            .iter()
            .zip(keep)
            .find(|(op, &k)| k && op.operands.iter().any(reads_removed))
        {
            return Err(format!("{} reads a removed op's result", op.kind.name()));
        }
        if self.results.iter().any(reads_removed) {
            return Err("the function returns a removed op's result".into());
        }
        let mut flags = keep.iter();
        self.ops.retain(|_| *flags.next().expect("one flag per op"));
        Ok(())
    }

    /// Returns `results` instead (one per result, each of the type of the one it replaces).
    pub fn set_results(&mut self, results: Vec<Value>) -> Result<(), String> {
        if results.len() != self.results.len()
            || results
                .iter()
                .zip(&self.results)
                .any(|(&new, &old)| self.ty(new) != self.ty(old))
        {
            return Err("the new results must have the types of the old ones".into());
        }
        self.results = results;
        Ok(())
    }

    /// The function with `pass` applied to the function of every region of its ops, innermost
    /// first, so that a pass over one function reaches every function a module runs. A
    /// function several calls share is passed over once and stays shared. Refused when `pass`
    /// changes a region's signature.
    pub fn map_regions(self, pass: &mut dyn FnMut(Func) -> Func) -> Result<Func, TypeError> {
        self.map_regions_once(pass, &mut HashMap::new())
    }

    /// `map_regions`, with the regions already passed over by id (each kept beside its new
    /// form, so that no other function takes its address meanwhile).
    fn map_regions_once(
        mut self,
        pass: &mut dyn FnMut(Func) -> Func,
        done: &mut HashMap<usize, (Region, Region)>,
    ) -> Result<Func, TypeError> {
        for index in 0..self.ops.len() {
            let regions: Vec<Region> = self.ops[index]
                .kind
                .regions()
                .into_iter()
                .cloned()
                .collect();
            if regions.is_empty() {
                continue;
            }
            let mut rewritten = Vec::with_capacity(regions.len());
            for region in regions {
                if let Some((_, new)) = done.get(&region.id()) {
                    rewritten.push(new.clone());
                    continue;
                }
                let inner = region.func().clone().map_regions_once(pass, done)?;
                let new = Region::new(pass(inner));
                done.insert(region.id(), (region, new.clone()));
                rewritten.push(new);
            }
            let kind = self.ops[index].kind.with_regions(rewritten);
            let operands = self.ops[index].operands.clone();
            self.replace_op(index, kind, operands)?;
        }
        Ok(self)
    }

    /// Whether `other` computes what this function computes in the same way: the same argument
    /// and result types, the same ops in the same order on corresponding values (whatever
    /// their numbers).
    pub fn same_as(&self, other: &Func) -> bool {
        if self.arg_types() != other.arg_types() || self.ops.len() != other.ops.len() {
            return false;
        }
        let mut map: HashMap<Value, Value> = self
            .args
            .iter()
            .copied()
            .zip(other.args.iter().copied())
            .collect();
        for (a, b) in self.ops.iter().zip(&other.ops) {
            let operands_match = a.operands.len() == b.operands.len()
                && a.operands
                    .iter()
                    .zip(&b.operands)
                    .all(|(x, y)| map.get(x) == Some(y));
            if a.kind != b.kind || !operands_match || a.results.len() != b.results.len() {
                return false;
            }
            for (&x, &y) in a.results.iter().zip(&b.results) {
                if self.ty(x) != other.ty(y) {
                    return false;
                }
                map.insert(x, y);
            }
        }
        self.results.len() == other.results.len()
            && self
                .results
                .iter()
                .zip(&other.results)
                .all(|(x, y)| map.get(x) == Some(y))
    }

    /// Appends an argument.
    pub fn add_arg(&mut self, ty: TensorType, attrs: ArgAttrs) -> Value {
        let v = self.add_value(ty);
        self.args.push(v);
        self.arg_attrs.push(attrs);
        v
    }

    /// Makes every op and result that reads `from` read `to`, a value of the same type.
    pub fn replace_uses(&mut self, from: Value, to: Value) -> Result<(), String> {
        if self.ty(from) != self.ty(to) {
            return Err(format!(
                "cannot replace a {} by a {}",
                self.ty(from),
                self.ty(to)
            ));
        }
        for op in &mut self.ops {
            for o in &mut op.operands {
                if *o == from {
                    *o = to;
                }
            }
        }
        for r in &mut self.results {
            if *r == from {
                *r = to;
            }
        }
        Ok(())
    }

    pub fn set_arg_attrs(&mut self, index: usize, attrs: ArgAttrs) {
        self.arg_attrs[index] = attrs;
    }

    pub fn set_result_attrs(&mut self, index: usize, attrs: ArgAttrs) {
        self.result_attrs[index] = attrs;
    }

    /// A new value of this type, for an op or argument about to be added.
    pub(super) fn add_value(&mut self, ty: TensorType) -> Value {
        self.types.push(ty);
        Value(self.value_count() as u32 - 1)
    }
}

/// A module: its `main` function and, when it is partitioned over devices, the mesh its
/// shardings refer to and the dialect they are written in.
#[derive(Clone, Debug, Default)]
pub struct Module {
    pub main: Func,
    pub sharding: Option<MeshSharding>,
    /// `main`'s body runs on each device of the mesh on that device's part of the arguments:
    /// `main`'s types are each device's, its shardings say how the parts make the whole, and its
    /// ops may communicate (collectives). Shardy's manual computation over every mesh axis.
    pub manual: bool,
}

impl Module {
    pub fn new(main: Func) -> Module {
        Module {
            main,
            sharding: None,
            manual: false,
        }
    }

    /// The types of `main`'s arguments as its callers pass them: in a manual module each
    /// device's part scaled by the mesh axes its sharding splits each dimension over, else
    /// `main`'s own.
    pub fn outer_arg_types(&self) -> Vec<TensorType> {
        self.outer(self.main.args(), self.main.arg_attrs())
    }

    /// The types of `main`'s results as its callers receive them (see `outer_arg_types`).
    pub fn outer_result_types(&self) -> Vec<TensorType> {
        self.outer(self.main.results(), self.main.result_attrs())
    }

    /// The functions the module's calls run (from `main`, its regions and the called functions
    /// themselves), each once, in the order first called, each with a symbol name unique in
    /// the module: its calls' name, numbered where two functions share one.
    pub fn callees(&self) -> Callees {
        let mut callees = Callees::default();
        // `main` is taken.
        let mut taken: HashMap<String, usize> = HashMap::from([("main".to_string(), 1)]);
        callees.gather(&self.main, &mut taken);
        callees
    }

    fn outer(&self, values: &[Value], attrs: &[ArgAttrs]) -> Vec<TensorType> {
        values
            .iter()
            .zip(attrs)
            .map(|(&v, a)| {
                let ty = self.main.ty(v);
                match (&a.sharding, &self.sharding) {
                    (Some(s), Some(m)) if self.manual => {
                        let shape = ty
                            .shape
                            .iter()
                            .zip(&s.dims)
                            .map(|(&d, axes)| {
                                let parts: i64 = axes
                                    .iter()
                                    .filter_map(|a| m.mesh.axis(a).map(|(_, a)| a.size))
                                    .product();
                                d * parts
                            })
                            .collect();
                        ty.with_shape(shape)
                    }
                    _ => ty.clone(),
                }
            })
            .collect()
    }
}

/// The functions a module's calls run, each with its symbol name ([`Module::callees`]).
#[derive(Clone, Debug, Default)]
pub struct Callees {
    functions: Vec<(String, Region)>,
    index: HashMap<usize, usize>,
    foreign: Vec<(String, Arc<ForeignFunction>)>,
    foreign_index: HashMap<*const ForeignFunction, usize>,
}

impl Callees {
    /// The functions `f`'s calls run, in order, each followed by those it runs itself.
    fn gather(&mut self, f: &Func, taken: &mut HashMap<String, usize>) {
        for op in &f.ops {
            if let Some((name, callee)) = op.kind.called() {
                if self.index.contains_key(&callee.id()) {
                    continue;
                }
                let symbol = unique_symbol(&name, taken);
                self.index.insert(callee.id(), self.functions.len());
                self.functions.push((symbol, callee.clone()));
            }
            if let OpKind::Foreign(function) = &op.kind {
                if let Entry::Vacant(entry) = self.foreign_index.entry(Arc::as_ptr(function)) {
                    entry.insert(self.foreign.len());
                    let symbol = unique_symbol(&function.name, taken);
                    self.foreign.push((symbol, function.clone()));
                }
            }
            for region in op.kind.regions() {
                self.gather(region.func(), taken);
            }
        }
    }

    /// Each function with its name, in the order first called.
    pub fn functions(&self) -> &[(String, Region)] {
        &self.functions
    }

    /// The symbol name of `callee`, a function of the module's calls.
    pub fn symbol(&self, callee: &Region) -> Option<&str> {
        let &i = self.index.get(&callee.id())?;
        Some(&self.functions[i].0)
    }

    /// Each foreign function the module calls with its name, in the order first called.
    pub fn foreign(&self) -> &[(String, Arc<ForeignFunction>)] {
        &self.foreign
    }

    /// The symbol name of `function`, a foreign function the module calls.
    pub fn foreign_symbol(&self, function: &Arc<ForeignFunction>) -> Option<&str> {
        let &i = self.foreign_index.get(&Arc::as_ptr(function))?;
        Some(&self.foreign[i].0)
    }
}

/// A symbol for `name` no other function of the module has (`taken` counts each name's uses).
fn unique_symbol(name: &str, taken: &mut HashMap<String, usize>) -> String {
    let name = symbol_name(name);
    let count = taken.entry(name.clone()).or_insert(0);
    let symbol = match *count {
        0 => name,
        n => format!("{name}_{n}"),
    };
    *count += 1;
    symbol
}

/// `name` as a symbol of the module: letters, digits and underscores, not first a digit.
fn symbol_name(name: &str) -> String {
    let mut symbol: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if !symbol.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
        symbol.insert(0, '_');
    }
    symbol
}
