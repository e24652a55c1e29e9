"""Compiling ATen FX graphs with tpuc: `GraphCompiler` turns the graphs aot_autograd (or the
eager device, or `tpuc.spmd`) hands over into functions running on the runtime's devices —
partitioned around ops tpuc cannot lower (one warning per graph, or an error in strict mode),
specialised per bucket of sizes for graphs with symbolic sizes (Options.buckets: inputs padded,
the graph made exact under padding, or compiled per size where it cannot be), the program's
checks run on the host, inputs updated in place donated. Below both the Dynamo backend
(`backend.py`) and the eager device (`device.py`); what it needs of the device (its session, its
buffers, running partitioned graphs on it) reaches it through `runtime.device_hooks()`.
"""
from __future__ import annotations

import functools
import importlib
import itertools
import json
import operator
import os
import sys
import time
import warnings
from collections import Counter
from typing import NamedTuple

import torch
from torch._decomp import core_aten_decompositions
from torch._functorch.aot_autograd import make_boxed_func

from . import _tpuc, custom_ops, kernels
from .decompositions import EXTRA, NOT_DECOMPOSED, library_extra
from .graph import (
    HOST_ASSERTS,
    copy_module,
    data_dependent_sizes,
    is_host_check,
    is_structural,
    lowerable,
    op_name,
    serialize,
    sizes_within_subgraphs,
    source_line,
    unsupported_ops,
)
from .options import Options
from .runtime import CompiledGraph, device_hooks, session

_GRAPH_IDS = itertools.count()


@functools.cache
def _core_aten_table() -> dict:
    # torch builds this table anew on every call, enumerating every registered op (about 0.1 s,
    # which the device paid for each op it planned). Ops a library registers later still
    # decompose when traced, through their own CompositeImplicitAutograd kernels.
    return dict(core_aten_decompositions())


def decompositions(opts: Options, lowered: "LoweredOps | None" = None) -> dict:
    """The decompositions aot_autograd applies: torch's core-ATen table with tpuc's changes,
    and given the ops tpuc lowers (`lowered`), the ATen equivalents of the custom ops among the
    rest (`custom_ops.EQUIVALENTS`)."""
    if opts.decompositions == "none":
        return {}
    keep = frozenset(opts.keep_whole)
    table = dict(_base_decompositions(keep, "torchvision" in sys.modules))
    if lowered is not None:
        table.update(_undecomposed_removed(custom_ops.decompositions(lowered), keep))
    return table


@functools.cache
def _base_decompositions(keep: frozenset, with_library_extra: bool) -> dict:
    # Built once per choice: filtering torch's table costs about 3 ms, which the device paid for
    # every op it planned.
    return _undecomposed_removed({**_core_aten_table(), **EXTRA, **(library_extra() if with_library_extra else {})}, keep)


def _undecomposed_removed(table: dict, keep: frozenset) -> dict:
    return {op: fn for op, fn in table.items() if str(op) not in keep and op not in NOT_DECOMPOSED}


def _has_symbolic_sizes(gm: torch.fx.GraphModule) -> bool:
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        value = node.meta.get("val")
        if isinstance(value, torch.SymInt):
            return True
        if isinstance(value, torch.Tensor) and any(not isinstance(d, int) for d in value.shape):
            return True
    return False


def _size_origins(gm: torch.fx.GraphModule) -> dict[str, str]:
    """Each symbol whose value tensor values decide, with the op of the first node producing it."""
    origins: dict[str, str] = {}
    for node in gm.graph.nodes:
        if node.op == "call_function":
            for symbol in data_dependent_sizes(node):
                origins.setdefault(symbol, op_name(node))
    return origins


def _size_decided_by_values(gm: torch.fx.GraphModule, op: str, origins: dict[str, str]) -> str | None:
    """Why `op`'s nodes are not compiled when their sizes depend on tensor values, or None: the
    whole reason at the op making the size, a pointer to it at the ops using it."""
    symbols = sorted({s for n in gm.graph.nodes if n.op == "call_function" and op_name(n) == op
                      for s in data_dependent_sizes(n)})
    if not symbols:
        return None
    made_here = [s for s in symbols if origins.get(s) == op]
    if not made_here:
        return "uses the size " + ", ".join(f"{s} of {origins.get(s, '?')}" for s in symbols)
    return (f"its result's size ({', '.join(made_here)}) depends on tensor values and tpuc compiles "
            "static sizes: give the op its size where it takes one (`output_size=`), or leave "
            "torch._dynamo.config.capture_dynamic_output_shape_ops off so that Dynamo runs it in "
            "eager torch")


def describe_unsupported(gm: torch.fx.GraphModule, missing: Counter) -> str:
    lines = []
    origins = _size_origins(gm)
    for op, count in missing.most_common():
        where = next(
            (source_line(n) for n in gm.graph.nodes if n.op == "call_function" and op_name(n) == op and source_line(n)),
            None,
        )
        why = custom_ops.UNTRACEABLE.get(op) or _size_decided_by_values(gm, op, origins)
        lines.append(f"  {op} x{count}" + (f" (first at {where})" if where else "") + (f": {why}" if why else ""))
    return "\n".join(lines)


class LoweredOps:
    """`op in LoweredOps()`: whether tpuc lowers an ATen overload, its variants included (in-place,
    `out=`, the `_copy` forms of views), asked of the compiler once per overload; or the backend
    rewrites it into ops tpuc lowers before compiling (`REWRITTEN`)."""

    REWRITTEN = {"aten.quantize_per_tensor.default"}  # `_quantized_results`

    def __init__(self):
        self.known: dict[str, bool] = dict.fromkeys(self.REWRITTEN, True)

    def __contains__(self, op: str) -> bool:
        if kernels.registered(op):  # registered at any time, so never cached
            return True
        found = self.known.get(op)
        if found is None:
            found = self.known[op] = _tpuc.is_supported(op)
        return found


class Layouts(NamedTuple):
    """How a graph's inputs and outputs are laid out over the mesh: a partition spec per
    position (None: whole on every device), or None for all of them whole; which outputs are the
    new values of inputs the graph updates, (output, input) positions; and whether outputs
    without a spec are left to XLA's partitioner instead of whole (`open`)."""

    inputs: list | None
    results: list | None
    updated: tuple = ()
    open: bool = False


def _mutations() -> tuple[list, set]:
    """What aot_autograd says of the graph it is compiling: the inputs it updates, in the order
    it returns their new values first (`mutated_inp_runtime_indices`), and those whose data
    changes (not only their metadata, as a resize does)."""
    context = torch._guards.TracingContext.try_get()
    metadata = getattr(context, "fw_metadata", None)
    mutated = list(getattr(metadata, "mutated_inp_runtime_indices", None) or [])
    info = getattr(metadata, "input_info", None) or []
    data = {i for i, each in enumerate(info) if getattr(each, "mutates_data", False)}
    return mutated, data


def _without_input_aliases(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """`gm` without computing the outputs aot_autograd makes again from the inputs they view
    (it replays the views on the caller's tensors and reads only the compiled output's shape):
    each is an empty tensor of its shape, and what only it needed is dropped. An `as_strided`
    of an input that reads storage beyond the input's own elements (torch's partial views)
    then needs no value tpuc's program cannot have."""
    from torch._functorch._aot_autograd.schemas import OutputType

    metadata = getattr(torch._guards.TracingContext.try_get(), "fw_metadata", None)
    info = getattr(metadata, "output_info", None)
    if not info or on_device(gm):
        return gm
    regenerated = (OutputType.alias_of_input, OutputType.is_input)
    first = len(getattr(metadata, "mutated_inp_runtime_indices", None) or [])
    returned = _returned(gm)
    stand_ins = {}
    for j, each in enumerate(info):
        node = returned[first + j] if first + j < len(returned) else None
        value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        if (each.output_type in regenerated and node.op != "placeholder" and isinstance(value, torch.Tensor)
                and all(isinstance(d, int) for d in value.shape)):
            stand_ins[first + j] = torch.empty(tuple(value.shape), dtype=value.dtype)
    if not stand_ins:
        return gm
    gm = copy_module(gm)
    output = next(n for n in gm.graph.nodes if n.op == "output")
    single = not isinstance(output.args[0], (tuple, list))
    outputs = [output.args[0]] if single else list(output.args[0])
    for i, stand_in in stand_ins.items():
        outputs[i] = stand_in
    output.args = (outputs[0] if single else tuple(outputs),)
    gm.graph.eliminate_dead_code()
    gm.graph.lint()
    gm.recompile()
    return gm


def _returned(gm: torch.fx.GraphModule) -> list:
    """What the graph returns, as a list."""
    returned = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    return list(returned) if isinstance(returned, (tuple, list)) else [returned]


def _fits(node, spec) -> bool:
    """Whether `spec` can lay out the tensor the graph node `node` stands for."""
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return spec is not None and isinstance(value, torch.Tensor) and len(spec) <= value.dim()


class GraphCompiler:
    """Compiles the graphs aot_autograd hands over (forward, backward, inference)."""

    def __init__(self, opts: Options, specs: list | None = None, batch: tuple | None = None,
                 checked=None):
        """`checked(gm, name, compiled)`, when given, wraps each compiled graph (the backend's
        `compare` option: each call checked against PyTorch on the CPU)."""
        self.opts = opts
        self.checked = checked
        self.session = session(opts.plugin, opts.mesh)
        self.supported = LoweredOps()
        # The layout of each input of the Dynamo graph over the mesh (None on one device).
        self.specs = specs
        # (row counts, axes) of the batch the inputs split, when they split one (`batch_split`).
        self.batch = batch
        # Set for one rank's graphs run on every device (tpuc.spmd): the process groups by name.
        self.process_groups = None
        # The layout XLA's partitioner gave each output of the forward left to it, and the layout
        # of each input it received, by node name (the backward's placeholder of a saved value
        # has the name of the forward's node it is).
        self.read_layouts: dict = {}
        self.saved_primals: dict = {}
        # The backward graph of the training graph being compiled, once partitioned: compiled
        # ahead after the forward (`compile_ahead`).
        self.backward_ahead: torch.fx.GraphModule | None = None

    def forward(self, gm, example_inputs):
        layouts = self.layouts(gm)
        # The backward's gradients come back laid out as the forward's inputs they belong to, and
        # the inputs it saves for the backward (its placeholders, by name) stay laid out so.
        self.primal_layouts = layouts.inputs
        placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
        self.saved_primals = dict(zip(placeholders, layouts.inputs or ()))
        # What else it returns (the values it saves, its outputs) XLA's partitioner lays out as
        # they are computed, and the backward takes them so (`read_layouts`, by name), instead
        # of the forward gathering each whole.
        if layouts.inputs is not None:
            layouts = layouts._replace(open=True)
        compiled = self.compile(_without_input_aliases(gm), "forward", self.weight_inputs(), layouts)
        # The backward (from the partition) compiles while the forward's first call goes on.
        backward, self.backward_ahead = self.backward_ahead, None
        if backward is not None:
            self.compile_ahead(backward, "backward")
        return compiled

    def backward(self, gm, example_inputs):
        # Saved values and tangents arrive as the forward returned them (inputs as they came,
        # values split along a batch, or whole); the gradients (one output per forward input,
        # None where none is needed) are split as their inputs are.
        primals = getattr(self, "primal_layouts", None)
        returned = _returned(gm)
        grads = primals if primals is not None and len(returned) == len(primals) else None
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        known = {**self.read_layouts, **self.saved_primals}
        saved = None
        if self.batch or any(spec is not None for spec in known.values()):
            saved = [known[p.name] if p.name in known else self.batch_spec(p) for p in placeholders]
        return self.compile(gm, "backward", None, Layouts(saved, grads))

    def inference(self, gm, example_inputs):
        layouts = self.layouts(gm)
        return self.compile(_without_input_aliases(gm), "inference", self.weight_inputs(), layouts)

    def layouts(self, gm: torch.fx.GraphModule) -> "Layouts | None":
        """The layouts of a forward or inference graph's inputs (`primal_specs`) and of its
        outputs: an input aot_autograd updates (an optimizer step's parameters and state) is
        returned first, laid out as the input is; the other outputs follow the batch
        (`batch_spec`) when the inputs split one, else are whole."""
        mutated, data = _mutations()
        updated = tuple((j, i) for j, i in enumerate(mutated) if i in data)
        primals = self.primal_specs(gm)
        if primals is None:
            return Layouts(None, None, updated)
        results = [primals[i] for i in mutated]
        position = {n: i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
        # An input returned as it is (saved for the backward) keeps its layout.
        results += [primals[position[node]] if node in position else self.batch_spec(node)
                    for node in _returned(gm)[len(mutated):]]
        return Layouts(primals, results, updated)

    def batch_spec(self, node) -> list | None:
        """A value's layout when the inputs split a batch (else None): split like them when its first
        dimension has a batch-major size (activations, which a training forward saves for the
        backward, and outputs per example; `batch_split`), else whole. A guess (a weight of
        such a size is split too) only costs communication: layouts never change values."""
        if not self.batch:
            return None
        rows, axes = self.batch
        value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        if isinstance(value, torch.Tensor) and value.dim() and int(value.shape[0]) in rows:
            return [list(axes)]
        return None

    def primal_specs(self, gm: torch.fx.GraphModule) -> list | None:
        """The layouts of a forward graph's inputs: those of the Dynamo graph's inputs, which
        aot_autograd hands on in order (None where a placeholder does not fit its layout)."""
        if self.specs is None:
            return None
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        if len(placeholders) != len(self.specs):
            return None
        return [spec if _fits(p, spec) else None for p, spec in zip(placeholders, self.specs)]

    def weight_inputs(self) -> frozenset[int] | None:
        """Positions of the inputs of the graph aot_autograd is compiling that are parameters or
        buffers (Dynamo marks them static) and that the graph does not update (an optimizer
        step's parameters change every call: nothing derived from them is worth keeping); None
        when hoisting is off or it does not say."""
        if not self.opts.hoist_weights:
            return None
        context = torch._guards.TracingContext.try_get()
        indices = getattr(getattr(context, "fw_metadata", None), "static_input_indices", None)
        if indices is None:
            return None
        return frozenset(indices) - _mutations()[1]

    def compile(self, gm: torch.fx.GraphModule, kind: str, weights: frozenset[int] | None = None,
                layouts: "Layouts | None" = None):
        """`weights`: positions of the inputs that are the model's parameters and buffers, whose
        derived values (see `Options.hoist_weights`) are computed once per version; `layouts`: the
        inputs' and outputs' layouts over the mesh."""
        name = f"graph_{next(_GRAPH_IDS):03d}_{kind}"
        if _has_symbolic_sizes(gm):
            compiled = make_boxed_func(SpecializingGraph(gm, self, name, weights, layouts))
        else:
            compiled = self.compile_static(gm, name, weights, layouts)
        if self.checked is not None:
            return self.checked(gm, name, compiled)
        return compiled

    def compile_static(self, gm: torch.fx.GraphModule, name: str, weights: frozenset[int] | None = None,
                       layouts: "Layouts | None" = None):
        """A boxed function running the static graph `gm`."""
        missing = unsupported_ops(gm, self.supported)
        if not missing:
            try:
                return _boxed(self.compile_whole(gm, name, weights, layouts))
            except _tpuc.TpucError as error:
                # An op tpuc lowers, but not with these arguments: run that node eagerly.
                node_name = getattr(error, "node", None)
                if self.opts.strict or node_name is None:
                    raise
                warnings.warn(f"tpuc: {name}: {error}; that node runs in eager torch", stacklevel=2)
                return make_boxed_func(self.partitioned(gm, name, frozenset({node_name})))
        report = describe_unsupported(gm, missing)
        if self.opts.strict:
            error = _tpuc.UnsupportedOpsError(f"{name}: tpuc cannot lower these ops (strict mode):\n{report}")
            error.ops = sorted(missing)
            raise error
        total = sum(missing.values())
        warnings.warn(
            f"tpuc: {name}: {total} op(s) of {len(missing)} kind(s) it cannot lower run in eager torch:\n{report}",
            stacklevel=2,
        )
        return make_boxed_func(self.partitioned(gm, name))

    def partitioned(self, gm: torch.fx.GraphModule, name: str, refused: frozenset[str] = frozenset()):
        """A function running `gm` partitioned (`partition`): its other nodes run in eager torch,
        on the tpuc device for a graph over the device's tensors."""
        fused = self.partition(gm, name, refused)
        if on_device(gm):
            return device_hooks().eager(fused)
        return fused.forward

    def partition(self, gm: torch.fx.GraphModule, name: str, refused: frozenset[str] = frozenset()):
        """`gm` with each maximal supported region replaced by a compiled module. `refused`
        names nodes whose op is lowered but not with their arguments (found by compiling)."""
        from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
        from torch.fx.passes.operator_support import OperatorSupportBase

        supported = self.supported

        def lowered(node):
            return lowerable(node, supported) and node.name not in refused

        class Support(OperatorSupportBase):
            def is_node_supported(self, submodules, node):
                if node.op != "call_function":
                    return False
                return lowered(node.args[0]) if is_structural(node) else lowered(node)

        original = gm
        gm = copy_module(gm)
        partitioner = CapabilityBasedPartitioner(gm, Support(), allows_single_node_partition=True)
        fused = partitioner.fuse_partitions(partitioner.propose_partitions())
        for index, node in enumerate(n for n in fused.graph.nodes if n.op == "call_module"):
            submodule = getattr(fused, node.target)
            placeholders = [n for n in submodule.graph.nodes if n.op == "placeholder"]
            for placeholder, arg in zip(placeholders, node.args):
                if "val" not in placeholder.meta and isinstance(arg, torch.fx.Node):
                    placeholder.meta["val"] = arg.meta.get("val")
            try:
                compiled = self.compile_whole(submodule, f"{name}_part{index}")
            except _tpuc.TpucError as error:
                node_name = getattr(error, "node", None)
                if self.opts.strict or node_name is None or node_name in refused:
                    raise
                warnings.warn(f"tpuc: {name}: {error}; that node runs in eager torch", stacklevel=2)
                return self.partition(original, name, refused | {node_name})
            setattr(fused, node.target, _CompiledModule(compiled))
        fused.recompile()
        return fused

    def compile_whole(self, gm: torch.fx.GraphModule, name: str,
                      weights: frozenset[int] | None = None, layouts: "Layouts | None" = None) -> CompiledGraph:
        """Compiles every op of the static graph `gm`; `weights` and `layouts` as for `compile`."""
        return self.compile_prepared(self.prepare(gm, name, weights, layouts), name)

    def prepare(self, gm: torch.fx.GraphModule, name: str, weights: frozenset[int] | None = None,
                layouts: "Layouts | None" = None) -> "PreparedGraph":
        """`gm` serialized for the compiler, with how its arguments and outputs map to the
        compiled graph's: everything about compiling it that its sizes do not change."""
        specs, result_specs, updated, open_results = layouts or Layouts(None, None)
        own_inputs = sum(1 for n in gm.graph.nodes if n.op == "placeholder")
        gm, wrapped = _quantized_results(gm, name)
        gm, output_checks, argument_checks, single_value = _host_checks(gm)
        gm, constants = _lift_constants(gm, name)
        gm = sizes_within_subgraphs(gm)
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        position = {p: i for i, p in enumerate(placeholders)}
        output_node = next(n for n in gm.graph.nodes if n.op == "output")
        returned = output_node.args[0]
        single = not isinstance(returned, (tuple, list)) or bool(output_checks and single_value)
        returned = [returned] if not isinstance(returned, (tuple, list)) else list(returned)
        # Sizes the graph returns (a counter of a cache's length, say) are computed on the host
        # from the arguments; the size inputs only they read are no inputs of the compiled graph.
        on_host = {i: _size_function(v, position) for i, v in enumerate(returned) if _is_size(v)}
        on_host = {i: f for i, f in on_host.items() if f is not None}
        host_nodes = _size_nodes([returned[i] for i in on_host])
        inputs = []
        for i, p in enumerate(placeholders):
            if isinstance(p.meta.get("val"), torch.Tensor):
                inputs.append(i)
            elif any(user.op != "output" and user not in host_nodes for user in p.users):
                raise _tpuc.TpucError(f"{name}: input {p.name} is a {type(p.meta.get('val')).__name__}, not a tensor")
        # Opaque inputs (a DeviceMesh's script object, say) the graph only returns pass through:
        # the call returns the argument it was given.
        unused = [p for i, p in enumerate(placeholders) if i not in inputs]
        outputs, tensor_outputs = [], []
        for i, value in enumerate(returned):
            if i in on_host:
                outputs.append(("host", on_host[i]))
            elif isinstance(value, torch.fx.Node) and value.name in wrapped:
                outputs.append(("wrapped", (len(tensor_outputs), wrapped[value.name])))
                tensor_outputs.append(i)
            elif isinstance(value, torch.fx.Node) and isinstance(value.meta.get("val"), torch.Tensor):
                outputs.append(("tensor", len(tensor_outputs)))
                tensor_outputs.append(i)
            elif isinstance(value, torch.fx.Node) and value.op == "placeholder":
                outputs.append(("arg", position[value]))
            elif isinstance(value, torch.fx.Node):
                raise _tpuc.TpucError(f"{name}: output {i} ({value.name}) is not a tensor")
            else:
                outputs.append(("value", value))
        # The values torch checks after the call (an LU's info), returned last: checked on the host.
        checked = [lambda args, results, f=f: f(args) for f in argument_checks]
        if output_checks:
            checked += [lambda args, results, x=x, f=f: f(results[x].to("cpu"))
                        for (_, x), f in zip(outputs[-len(output_checks):], output_checks)]
            outputs = outputs[:-len(output_checks)]
        # Each compiled output's layout, from the output of the graph it is.
        laid_out_results = None if result_specs is None else [
            result_specs[i] if i < len(result_specs) and _fits(returned[i], result_specs[i]) else None
            for i in tensor_outputs]
        names = [returned[i].name for i in tensor_outputs]
        if unused or on_host:
            gm = _without(gm, unused, tensor_outputs)
            tensor_outputs = list(range(len(tensor_outputs)))
        # The graph's constants (lifted to trailing inputs) never change either.
        stable = None if weights is None else [i in weights or i >= own_inputs for i in inputs]
        laid_out = None if specs is None else [specs[i] if i < own_inputs else None for i in inputs]
        donate = _donations(updated, placeholders, returned, inputs, outputs)
        return PreparedGraph(gm, serialize(gm, tensor_outputs), inputs, outputs, single, constants, stable,
                             laid_out, laid_out_results, donate, open_results, names, checked)

    def compile_prepared(self, prepared: "PreparedGraph", name: str, args: list | None = None) -> CompiledGraph:
        """The prepared graph compiled; one with symbolic sizes for the shapes of `args`, the
        arguments it will run on."""
        p = prepared
        devices = self.device_outputs(p, name)
        compiled = self.session.compile(p.program, name, self.opts.compile, **self.request(p, args, devices))
        if p.open_results:
            self.read_layouts.update(zip(p.output_names, compiled.result_specs))
        if compiled.not_padded is not None:
            warnings.warn(f"tpuc: {name}: compiled for each size, not per bucket of sizes: {compiled.not_padded}",
                          stacklevel=2)
        constants = p.constants
        if self.process_groups is not None:
            # Every device's copy of a constant, stacked as the program's inputs are.
            count = self.session.runtime.devices
            constants = [c.expand(count, *c.shape).contiguous() for c in constants]
        if self.opts.dump_dir:
            dump_graph(self.opts.dump_dir, name, p.gm, compiled)
        return CompiledGraph(compiled, self.session, p.inputs, p.outputs, p.single, constants, devices, p.checks)

    def request(self, p: "PreparedGraph", args: list | None, devices: list | None) -> dict:
        """What compiling the prepared graph `p` asks of the runtime beyond the options
        (`_tpuc.Runtime.compile`'s keyword arguments), for `args` and `devices` as
        `compile_prepared` has them."""
        given = None if args is None else list(args) + p.constants
        input_dims = None if given is None else [list(given[i].shape) for i in p.inputs]
        # Inputs updated in place give their memory to their new value where the plugin's device
        # memory is the host's (elsewhere that needs tensors that live on the device); not for
        # inputs padded to a bucket (a copy), nor over a mesh, nor the device's buffers (their
        # tensors' views share them).
        in_place = (self.session.host_memory and self.session.mesh is None and self.process_groups is None
                    and devices is None)
        return dict(stable=p.stable, specs=p.laid_out, process_groups=self.process_groups,
                    result_specs=p.laid_out_results, input_dims=input_dims,
                    # Graphs over the tpuc device's tensors are compiled for each set of sizes
                    # (buffers are not padded to buckets).
                    bucketed=input_dims is not None and devices is None,
                    donate=p.donate if in_place and input_dims is None else None, open_results=p.open_results)

    def compile_ahead(self, gm: torch.fx.GraphModule, kind: str) -> None:
        """Starts compiling `gm`, a graph aot_autograd will hand over later (a training graph's
        backward, once the partition made it), in the background: the compile of the forward and
        the forward's run go on meanwhile, and the backward's own compile finds it done or waits
        for it. Only where nothing about it depends on the forward's compile (one device, static
        sizes, every op lowered, no checking wrapper); otherwise it is compiled when handed over."""
        if (self.session.mesh is not None or self.process_groups is not None or self.checked is not None
                or on_device(gm) or _has_symbolic_sizes(gm) or unsupported_ops(gm, self.supported)):
            return
        try:
            p = self.prepare(gm, kind)
        except _tpuc.TpucError:
            return  # said when the graph is handed over
        self.session.compile(p.program, kind, self.opts.compile, background=True, **self.request(p, None, None))

    def device_outputs(self, p: "PreparedGraph", name: str) -> list | None:
        """For a graph over the tpuc device's tensors (traced on fake tensors of the device, or
        making tensors there), the device type of each compiled output as traced; else None."""
        if not on_device(p.gm):
            return None
        device_session = device_hooks().session()
        if self.session is not device_session:
            raise _tpuc.TpucError(
                f"{name}: the tensors of the tpuc device live on its plugin's device "
                f"({device_session.runtime.platform}); a compiled function taking them runs there, not on the "
                f"plugin and mesh its options name")
        output = next(n for n in p.gm.graph.nodes if n.op == "output")
        returned = output.args[0] if isinstance(output.args[0], (tuple, list)) else [output.args[0]]
        return [where for where in map(_device_type, returned) if where is not None]


class PreparedGraph(NamedTuple):
    """A graph ready to compile (`GraphCompiler.prepare`): the graph as the compiler reads it,
    and how the call's arguments and outputs map to the compiled graph's (as `CompiledGraph`
    takes them), with the inputs' stability and layouts, whether outputs without a layout are
    left to XLA's partitioner, the names of the nodes the compiled outputs are, and the
    outputs torch checks on the host after the call (`_host_checks`)."""

    gm: torch.fx.GraphModule
    program: bytes
    inputs: list
    outputs: list
    single: bool
    constants: list
    stable: list | None
    laid_out: list | None
    laid_out_results: list | None
    donate: list
    open_results: bool
    output_names: list
    checks: list


# torch's quantized dtypes: the integer type holding their values and its range.
_QUANTIZED = {torch.quint8: (torch.uint8, 0, 255), torch.qint8: (torch.int8, -128, 127),
              torch.qint32: (torch.int32, -2**31, 2**31 - 1)}


def _quantized_results(gm: torch.fx.GraphModule, name: str):
    """`gm` with each `aten.quantize_per_tensor` computing the integer values of its quantized
    tensor (as `quantized_decomposed.quantize_per_tensor`, which tpuc lowers), and per such node,
    by name, the function making the quantized tensor of its values on the host after the call.
    (torch traces no op on quantized tensors: such a tensor can only be a result.)"""
    quantize = torch.ops.aten.quantize_per_tensor.default
    nodes = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is quantize]
    if not nodes:
        return gm, {}
    importlib.import_module("torch.ao.quantization.fx._decomposed")  # registers quantized_decomposed

    gm = copy_module(gm)
    wrapped = {}
    for node in [n for n in gm.graph.nodes if n.op == "call_function" and n.target is quantize]:
        x, scale, zero_point, dtype = node.args
        if any(user.op != "output" for user in node.users):
            raise _tpuc.TpucError(f"{name}: {node.name}: a quantized tensor used by other ops in the graph")
        if dtype not in _QUANTIZED:
            raise _tpuc.TpucError(f"{name}: {node.name}: not supported: quantization to {dtype}")
        storage, low, high = _QUANTIZED[dtype]
        with gm.graph.inserting_before(node):
            values = gm.graph.call_function(torch.ops.quantized_decomposed.quantize_per_tensor.default,
                                            (x, scale, zero_point, low, high, storage))
        values.meta = {**node.meta, "val": node.meta["val"].new_empty(node.meta["val"].shape, dtype=storage)}
        node.replace_all_uses_with(values)
        gm.graph.erase_node(node)
        wrapped[values.name] = (lambda v, scale=scale, zero_point=zero_point:
                                torch._make_per_tensor_quantized_tensor(v, scale, zero_point))
    gm.graph.lint()
    gm.recompile()
    return gm, wrapped


def _host_checks(gm: torch.fx.GraphModule):
    """`gm` without its checks, which run on the host at each call instead:
    - each `with_effects` of a check (`graph.HOST_CHECKS`) is removed, its effect token passes
      through, and the tensor it checks becomes an extra output, after the others;
    - an assertion on a tensor (`_assert_async`) likewise returns its condition;
    - an assertion on sizes (`_assert_scalar`, `sym_constrain_range`) becomes a function of
      the call's arguments (a condition tpuc cannot compute from them is an error).
    Returns the graph, one check per extra output (a function of its value on the CPU), the
    checks of the arguments, and whether the graph returned a single value."""
    output = next(n for n in gm.graph.nodes if n.op == "output")
    single = not isinstance(output.args[0], (tuple, list))
    if not any(is_host_check(n) for n in gm.graph.nodes):
        return gm, [], [], single
    gm = copy_module(gm)
    graph = gm.graph
    output = next(n for n in graph.nodes if n.op == "output")
    position = {p: i for i, p in enumerate(n for n in graph.nodes if n.op == "placeholder")}
    returned_checks, output_checks, argument_checks, read = [], [], [], []
    for node in [n for n in graph.nodes if is_host_check(n)]:
        if node.target in HOST_ASSERTS:
            check = _assertion(node, position)
            read.extend(node.all_input_nodes)
            if isinstance(check, torch.fx.Node):
                returned_checks.append(check)
                output_checks.append(_true_or_raise(node))
            else:
                argument_checks.append(check)
            graph.erase_node(node)
            continue
        token, _, info, api = node.args[:4]
        for user in list(node.users):
            # getitem(with_effects, 0) is the token after the effect; the check returns nothing else.
            user.replace_all_uses_with(token)
            graph.erase_node(user)
        graph.erase_node(node)
        is_matrix = node.kwargs.get("is_matrix", True)
        returned_checks.append(info)
        # torch's own check, with its error for a singular or indefinite matrix.
        output_checks.append(lambda info, api=api, is_matrix=is_matrix:
                             torch.ops.aten._linalg_check_errors(info, api, is_matrix=is_matrix))
        if token.op == "placeholder":
            # Effect tokens are None at run time (aot_autograd's wrapper passes them): an
            # argument the graph returns as it is, not a tensor input.
            token.meta = {**token.meta, "val": None}
    returned = output.args[0]
    returned = [returned] if single else list(returned)
    output.args = (tuple(returned + returned_checks),)
    # The size arithmetic only the assertions read.
    erased = set()
    while read:
        node = read.pop()
        if node.op == "call_function" and not node.users and node not in erased:
            read.extend(node.all_input_nodes)
            graph.erase_node(node)
            erased.add(node)
    graph.lint()
    gm.recompile()
    return gm, output_checks, argument_checks, single


def _assertion(node: torch.fx.Node, position: dict):
    """The condition an assertion checks: a tensor node of the graph (`_assert_async`), or a
    function of the call's arguments that raises torch's error when it does not hold."""
    target = node.target
    if target in (torch.ops.aten._assert_async.default, torch.ops.aten._assert_async.msg):
        return node.args[0]
    if target is torch.ops.aten._assert_scalar.default:
        condition, message = node.args[0], node.args[1] if len(node.args) > 1 else "assertion failed"
        holds = _host_value(condition, position, node)

        def check(args):
            if not holds(args):
                raise RuntimeError(message)
        return check
    size = _host_value(node.args[0], position, node)
    low = node.kwargs.get("min", node.args[1] if len(node.args) > 1 else None)
    high = node.kwargs.get("max", node.args[2] if len(node.args) > 2 else None)
    if target is torch.ops.aten.sym_constrain_range_for_size.default:
        low = 0 if low is None else low

    def check_range(args):
        value = size(args)
        if (low is not None and value < low) or (high is not None and value > high):
            raise RuntimeError(f"Invalid value range for {value} between [{low}, {high}]")
    return check_range


def _host_value(value, position: dict, node: torch.fx.Node):
    """A function of the call's arguments giving `value` (a number, or a size computed from
    the arguments); an error naming `node` when it is neither."""
    if not isinstance(value, torch.fx.Node):
        return lambda args: value
    f = _size_function(value, position)
    if f is None:
        raise _tpuc.TpucError(f"{op_name(node)} ({node.name}) checks {value.name}, which tpuc cannot compute on "
                              f"the host from the call's arguments")
    return f


def _true_or_raise(node: torch.fx.Node):
    """The host check of `_assert_async` (given the condition on the CPU): torch's error when
    the condition is zero."""
    message = node.args[1] if len(node.args) > 1 else "Expected Tensor with single nonzero value, but got zero"

    def check(condition: torch.Tensor):
        if not bool(condition):
            raise RuntimeError(message)
    return check


def on_device(gm: torch.fx.GraphModule) -> bool:
    """Whether `gm` computes on the tpuc device: traced on its tensors (fake tensors of the
    device), or making tensors there."""
    return any(_device_type(n) == "tpuc" for n in gm.graph.nodes)


def _device_type(node) -> str | None:
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return value.device.type if isinstance(value, torch.Tensor) else None


def _donations(updated: tuple, placeholders: list, returned: list, inputs: list, outputs: list) -> list:
    """(compiled input, compiled output) of each input whose new value the graph returns
    (`Layouts.updated`), which aot_autograd copies into the input after the call: an output of
    the input's shape and dtype can take the input's memory instead (the copy then finds the
    value already there)."""
    pairs = []
    for j, i in updated:
        if j >= len(outputs) or i not in inputs or outputs[j][0] != "tensor":
            continue
        old, new = placeholders[i].meta.get("val"), returned[j].meta.get("val")
        if isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor) and old.shape == new.shape \
                and old.dtype == new.dtype:
            pairs.append((inputs.index(i), outputs[j][1]))
    return pairs


def _lift_constants(gm: torch.fx.GraphModule, name: str):
    """`gm` with its constant tensors (get_attr nodes) turned into trailing inputs, and those
    tensors, which the compiled graph is then called with after the graph's own arguments."""
    import operator

    def is_constant(node):
        # A graph module is a subgraph a higher-order operator runs (torch.cond's branches),
        # serialized with it, not a constant.
        return node.op == "get_attr" and not isinstance(operator.attrgetter(node.target)(gm), torch.fx.GraphModule)

    if not any(is_constant(n) for n in gm.graph.nodes):
        return gm, []
    gm = copy_module(gm)
    nodes = list(gm.graph.nodes)
    anchor = next((n for n in reversed(nodes) if n.op == "placeholder"), None)
    constants = []
    for node in [n for n in nodes if is_constant(n)]:
        value = operator.attrgetter(node.target)(gm)
        if not isinstance(value, torch.Tensor):
            raise _tpuc.TpucError(f"{name}: constant {node.target} is a {type(value).__name__}, not a tensor")
        if anchor is None:
            context = gm.graph.inserting_before(next(iter(gm.graph.nodes)))
        else:
            context = gm.graph.inserting_after(anchor)
        with context:
            placeholder = gm.graph.placeholder(f"constant_{len(constants)}")
        placeholder.meta["val"] = node.meta.get("val", value)
        node.replace_all_uses_with(placeholder)
        gm.graph.erase_node(node)
        anchor = placeholder
        constants.append(value)
    gm.recompile()
    return gm, constants


def _is_size(value) -> bool:
    return isinstance(value, torch.fx.Node) and isinstance(value.meta.get("val"), torch.SymInt)


_SIZE_OPS = {operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod, operator.neg,
             # the comparisons of shape assertions
             operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge, operator.and_,
             operator.or_, operator.not_}


def _size_function(node: torch.fx.Node, position: dict):
    """A function of the call's arguments computing the size `node` stands for from size
    inputs, tensor inputs' sizes and integer arithmetic; None for anything else."""
    if node.op == "placeholder":
        i = position[node]
        if isinstance(node.meta.get("val"), torch.SymInt):
            return lambda args: int(args[i])
        return None
    if node.op != "call_function":
        return None
    if node.target is torch.ops.aten.sym_size.int:
        tensor, dim = node.args
        if not isinstance(tensor, torch.fx.Node) or tensor.op != "placeholder":
            return None
        i = position[tensor]
        return lambda args: int(args[i].shape[dim])
    if node.target not in _SIZE_OPS:
        return None
    parts = []
    for a in node.args:
        if isinstance(a, torch.fx.Node):
            f = _size_function(a, position)
            if f is None:
                return None
            parts.append(f)
        elif isinstance(a, int):
            parts.append(lambda args, a=a: a)
        else:
            return None
    op = node.target
    return lambda args: op(*(f(args) for f in parts))


def _size_nodes(roots: list) -> set:
    """The nodes computing the sizes `roots` (those nodes and what they read, placeholders
    excluded)."""
    seen, todo = set(), list(roots)
    while todo:
        node = todo.pop()
        if node in seen or node.op == "placeholder":
            continue
        seen.add(node)
        todo.extend(a for a in node.all_input_nodes)
    return seen


def _without(gm: torch.fx.GraphModule, unused: list[torch.fx.Node], tensor_outputs: list[int]) -> torch.fx.GraphModule:
    """A copy of `gm` returning only its outputs at `tensor_outputs`, without the placeholders
    `unused` (which then have no users: the outputs left out may have returned them)."""
    gm = copy_module(gm)
    output = next(n for n in gm.graph.nodes if n.op == "output")
    returned = output.args[0]
    returned = list(returned) if isinstance(returned, (tuple, list)) else [returned]
    output.args = (tuple(returned[i] for i in tensor_outputs),)
    # What only the outputs left out read (sizes computed on the host) goes with them.
    gm.graph.eliminate_dead_code()
    names = {p.name for p in unused}
    for node in list(gm.graph.nodes):
        if node.op == "placeholder" and node.name in names:
            gm.graph.erase_node(node)
    gm.recompile()
    return gm


def _boxed(compiled: CompiledGraph):
    def run(args):
        return compiled.call(args)

    run._boxed_call = True
    return run


class _CompiledModule(torch.nn.Module):
    """A compiled region inside a partitioned graph."""

    def __init__(self, compiled: CompiledGraph):
        super().__init__()
        self.compiled = compiled

    def forward(self, *args):
        return self.compiled.call(list(args))


class SpecializingGraph:
    """A graph with symbolic sizes, compiled once per distinct set of concrete input sizes."""

    def __init__(self, gm: torch.fx.GraphModule, compiler: GraphCompiler, name: str,
                 weights: frozenset[int] | None = None, layouts: "Layouts | None" = None):
        self.gm = gm
        self.compiler = compiler
        self.name = name
        self.weights = weights
        self.layouts = layouts
        self.variants: dict[tuple, object] = {}
        # The graph with its size inputs read from its tensors' shapes (`_sizes_from_tensors`),
        # prepared for compiling: None before the first call, False where that cannot be done.
        self.sized = None
        # The inputs whose sizes vary between calls (tensors of symbolic shape, sizes): only
        # they tell variants apart; the guards of Dynamo and aot_autograd fix the others.
        self.varying = [i for i, p in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")
                        if _varies(p.meta.get("val"))]

    def __call__(self, *args):
        key = tuple(
            (tuple(a.shape), a.dtype, a.stride()) if isinstance(a, torch.Tensor) else ("value", a)
            for a in map(args.__getitem__, self.varying)
        )
        run = self.variants.get(key)
        if run is None:
            run = self.variants[key] = self.specialize(args)
        return run(list(args))

    def specialize(self, args):
        """The graph compiled for these arguments' sizes: the symbolic graph itself, whose sizes
        tpuc's compiler fixes from the inputs' shapes (no tracing again), when its size inputs
        are sizes of its tensors; else traced again for the sizes at hand."""
        name = f"{self.name}_v{len(self.variants)}"
        try:
            if self.sized is None:
                # Serialized once; its size computations (sym_size, integer arithmetic) are the
                # compiler's to fold for each set of sizes.
                sized = _sizes_from_tensors(self.gm)
                self.sized = False if sized is None else self.compiler.prepare(sized, self.name, self.weights,
                                                                                self.layouts)
            if self.sized is not False:
                return _boxed(self.compiler.compile_prepared(self.sized, name, list(args)))
        except _tpuc.TpucError:
            # Sizes tpuc cannot evaluate, or an op it lowers only for some arguments: the traced
            # graph says which (and runs that node in eager torch, unless strict).
            self.sized = False
        from torch.fx.experimental.proxy_tensor import make_fx

        static = make_fx(self.gm, tracing_mode="fake")(*args)
        return self.compiler.compile_static(static, name, self.weights, self.layouts)


def _varies(value) -> bool:
    """Whether a placeholder of example value `value` may take different sizes between calls:
    a tensor of symbolic shape or strides, a symbolic size, or anything that is not a tensor."""
    if not isinstance(value, torch.Tensor):
        return True
    return any(isinstance(n, torch.SymInt) for n in (*value.shape, *value.stride()))


def _sizes_from_tensors(gm: torch.fx.GraphModule) -> torch.fx.GraphModule | None:
    """A copy of `gm` in which each size input (a SymInt placeholder, as aot_autograd passes
    symbolic sizes) is read from a tensor input's shape instead (`aten.sym_size.int`), so that
    the inputs' shapes fix every size; the size inputs are left unused. None when a size input
    is no tensor input's dimension."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    where = {}
    for p in placeholders:
        value = p.meta.get("val")
        if isinstance(value, torch.Tensor):
            for d, size in enumerate(value.shape):
                if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
                    where.setdefault(size.node.expr, (p, d))
    sizes = [p for p in placeholders if isinstance(p.meta.get("val"), torch.SymInt)]
    # A size input that is no tensor's size may stay an input when only size arithmetic reads it
    # (what the graph returns of it is computed on the host: `GraphCompiler.prepare`).
    free = [s for s in sizes if s.meta["val"].node.expr not in where]
    if not all(_feeds_only_sizes(s) for s in free):
        return None
    sizes = [s for s in sizes if s not in free]
    gm = copy_module(gm)
    nodes = {n.name: n for n in gm.graph.nodes}
    anchor = next(n for n in reversed(list(gm.graph.nodes)) if n.op == "placeholder")
    for size in sizes:
        tensor, d = where[size.meta["val"].node.expr]
        with gm.graph.inserting_after(anchor):
            read = gm.graph.call_function(torch.ops.aten.sym_size.int, (nodes[tensor.name], d))
        read.meta["val"] = size.meta["val"]
        nodes[size.name].replace_all_uses_with(read)
        anchor = read
    gm.recompile()
    return gm


def _feeds_only_sizes(node: torch.fx.Node) -> bool:
    """Whether what reads `node` is integer arithmetic on sizes, ending in the graph's outputs."""
    for user in node.users:
        if user.op == "output":
            continue
        if user.op != "call_function" or user.target not in _SIZE_OPS or not _feeds_only_sizes(user):
            return False
    return True


def dump_graph(directory: str, name: str, gm: torch.fx.GraphModule, compiled) -> None:
    """Writes a compiled graph's FX graph, StableHLO, IR and timings into the dump directory."""
    os.makedirs(directory, exist_ok=True)
    base = os.path.join(directory, name)
    with open(base + ".fx.txt", "w") as f:
        f.write(gm.print_readable(print_output=False))
    with open(base + ".mlir", "w") as f:
        f.write(compiled.stablehlo)
    with open(base + ".ir.txt", "w") as f:
        f.write(compiled.ir_text)
    if compiled.prepared_stablehlo is not None:
        with open(base + ".prepared.mlir", "w") as f:
            f.write(compiled.prepared_stablehlo)
    lower, xla = compiled.timings
    with open(base + ".json", "w") as f:
        json.dump({"graph": name, "lower_seconds": lower, "xla_compile_seconds": xla, "cache": compiled.cache,
                   "bucket": compiled.bucket, "reused": compiled.reused,
                   "written": time.strftime("%Y-%m-%dT%H:%M:%S")}, f, indent=1)
