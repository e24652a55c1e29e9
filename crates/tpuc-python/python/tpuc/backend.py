"""The torch.compile backend: Dynamo graph -> aot_autograd (functional ATen, forward and
backward) -> tpuc's compiler and PJRT runtime, in process.

Graphs with ops tpuc cannot lower are partitioned: supported regions are compiled, the rest
runs in eager torch, with one warning per graph (or an error with strict=True / TPUC_STRICT=1).
Graphs with symbolic sizes (dynamic=True, automatic dynamic shapes) are compiled per bucket of
sizes (Options.buckets): the inputs padded to the bucket, the graph made exact under padding;
one tpuc cannot make exact is compiled per set of sizes instead.
"""
from __future__ import annotations

import functools

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.partitioners import default_partition

from . import custom_ops, flex_attention
from .compiler import GraphCompiler, LoweredOps, decompositions
from .graph import prim_views_as_aten
from .options import Options
from .runtime import device_hooks
from .sharding import attribute_specs, batch_split, gather_at_use, input_specs, recompute_gathered

__all__ = ["Options", "tpuc_backend"]


def tpuc_backend(gm: torch.fx.GraphModule, example_inputs, options: dict | None = None, **_ignored):
    """torch.compile(model, backend="tpuc", options={...}); see tpuc.Options."""
    return graphs_through(GraphCompiler, gm, example_inputs, Options.parse(options))


def graphs_through(compiler_class: type, gm: torch.fx.GraphModule, example_inputs, opts: Options):
    """The Dynamo graph `gm` taken through aot_autograd as the backend takes it, each graph it
    hands over given to a `compiler_class` (a `GraphCompiler`; `tpuc.doctor` examines them)."""
    gm = flex_attention.as_math(prim_views_as_aten(gm))
    lowered = LoweredOps()
    if opts.decompositions != "none":
        gm = custom_ops.inline(gm, lowered)
    specs = batch = None
    if opts.mesh is not None:
        inputs, at_use = input_specs(gm, example_inputs, opts.mesh, opts.plan)
        gather_at_use(gm, at_use, opts.mesh)
        batch = batch_split(gm, example_inputs, inputs)
        # aot_autograd passes the graph's tensor attributes first, then its inputs.
        specs = attribute_specs(gm, opts.mesh, opts.plan) + inputs
    checked = None
    if opts.compare is not None:
        from .compare import compared

        def checked(gm, name, compiled):
            return compared(gm, name, compiled, *opts.compare)
    compiler = compiler_class(opts, specs, batch, checked)
    return aot_autograd(
        partition_fn=functools.partial(_partition, compiler),
        fw_compiler=compiler.forward,
        bw_compiler=compiler.backward,
        inference_compiler=compiler.inference,
        decompositions=decompositions(opts, lowered),
    )(gm, example_inputs)


def _partition(compiler: GraphCompiler, joint, joint_inputs, **kwargs):
    """aot_autograd's default partition of the joint graph into forward and backward (what the
    model's forward computes in the forward, the rest in the backward), after
    marking what the backward recomputes rather than the forward saves (`recompute_gathered`).
    The backward is compiled ahead, once the forward is (`GraphCompiler.compile_ahead`)."""
    recompute_gathered(joint)
    forward, backward = default_partition(joint, joint_inputs, **kwargs)
    compiler.backward_ahead = backward
    return forward, backward


# torch.compile over tensors of the tpuc device: Dynamo runs them eagerly, not the device's code.
device_hooks().hide_from_dynamo()
