"""Checking tpuc's results against PyTorch's on the CPU: the tolerance test both debug tools
use (the tpuc device's debug mode, op by op), and the compile backend's `compare` option, which
runs each compiled graph's nodes one by one on the tpuc device against the CPU and names the
first node whose result diverges."""
from __future__ import annotations

import torch

from . import _tpuc
from .tolerance import difference


def _tensors(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _random(node: torch.fx.Node) -> bool:
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in target.tags


def _cpu_copy(value):
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_cpu_copy(v) for v in value)
    return value


def compared(gm: torch.fx.GraphModule, name: str, run, rtol: float, atol: float):
    """A boxed function calling the compiled graph `run` and checking each call against `gm`
    run by PyTorch on the CPU (on copies of the arguments, as they were before the call): when
    an output differs beyond rtol/atol, the graph's nodes are run one by one, each on the tpuc
    device from the CPU's values of its inputs, and the first whose result differs is named with
    the user's line that made it."""
    has_random = any(_random(n) for n in gm.graph.nodes)

    def call(args):
        before = [_cpu_copy(a) for a in args]
        results = run(args)
        if has_random:
            # Random draws differ between the two: only node by node, the draws fed forward.
            _first_divergent_node(gm, name, before, rtol, atol)
            return results
        expected = gm(*[_cpu_copy(a) for a in before])
        got, want = _tensors(results), _tensors(expected)
        for index, (g, w) in enumerate(zip(got, want)):
            found = difference(_cpu_copy(g), w, rtol, atol)
            if found is not None:
                _first_divergent_node(gm, name, before, rtol, atol)
                raise _tpuc.TpucError(
                    f"{name}: output {index} differs from PyTorch's on the CPU by {found}, "
                    "though no node alone does (differences within the tolerance, added up)")
        return results

    call._boxed_call = True
    return call


def _first_divergent_node(gm: torch.fx.GraphModule, name: str, args: list, rtol: float, atol: float) -> None:
    """Runs `gm`'s nodes one by one on the CPU and, from the same inputs, on the tpuc device;
    raises at the first node whose results differ."""
    from .accelerator import NAME
    from .graph import source_line

    env: dict = {}
    placeholders = iter(args)
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            env[node] = next(placeholders)
            continue
        if node.op == "output":
            return
        if node.op == "get_attr":
            env[node] = getattr(gm, node.target)
            continue
        cpu_args, cpu_kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: _cpu_copy(env[n]))
        want = node.target(*cpu_args, **cpu_kwargs)
        env[node] = want
        if node.op != "call_function" or _random(node) or not isinstance(node.target, torch._ops.OpOverload):
            continue
        on_device = torch.utils._pytree.tree_map(
            lambda v: v.to(NAME) if isinstance(v, torch.Tensor) else v, (cpu_args, cpu_kwargs))
        got = node.target(*on_device[0], **on_device[1])
        for g, w in zip(_tensors(got), _tensors(want)):
            found = difference(g.cpu(), w, rtol, atol)
            if found is not None:
                line = source_line(node) or "(no line of the user's code)"
                raise _tpuc.TpucError(
                    f"{name}: node {node.name} ({node.target}) differs from PyTorch's on the CPU by {found}, "
                    f"at {line}")
