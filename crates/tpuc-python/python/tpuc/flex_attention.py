"""FlexAttention on the tpuc device. torch's `flex_attention` accepts only the devices it ships
kernels for; on the tpuc device it runs torch's own dense formulation (every score computed, the
score and mask functions applied to all of them, a masked softmax), in eager op by op and, in a
graph tpuc compiles, as ATen ops lowered with the rest of the graph, whose gradient aot_autograd
derives. Memory grows with the square of the sequence length, as in torch's eager fallback."""
from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import sys

import torch

from .accelerator import NAME

_MODULE = "torch.nn.attention.flex_attention"


class _WhenImported(importlib.abc.MetaPathFinder):
    """Accepts the device in torch's FlexAttention module once something imports it: importing it
    with the device would slow `import tpuc` by a third."""

    def find_spec(self, name, path, target=None):
        if name != _MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        exec_module = spec.loader.exec_module

        def exec_and_accept(module):
            exec_module(module)
            _accept_device(module)

        spec.loader.exec_module = exec_and_accept
        return spec


@functools.cache
def register() -> None:
    """Lets `flex_attention` take the device's tensors (forward and backward)."""
    if _MODULE in sys.modules:
        _accept_device(sys.modules[_MODULE])
    else:
        sys.meta_path.insert(0, _WhenImported())


def _accept_device(module) -> None:
    torch_validate_device = module._validate_device

    @functools.wraps(torch_validate_device)
    def validate_device(query, key, value):
        if query.device.type != NAME:
            torch_validate_device(query, key, value)

    module._validate_device = validate_device


def as_math(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """`gm` with each `flex_attention` operator replaced by its dense formulation, which
    aot_autograd traces to ATen ops (the score and mask functions included) like any other code
    of the graph. Its results are the operator's: output, log-sum-exp and maximum scores. The
    operators inside other operators' subgraphs (activation checkpointing's) are replaced too."""
    from torch._higher_order_ops.flex_attention import sdpa_dense

    hop = torch.ops.higher_order.flex_attention
    for module in gm.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        found = [node for node in module.graph.nodes if node.op == "call_function" and node.target is hop]
        for node in found:
            node.target = sdpa_dense
        if found:
            module.recompile()
    return gm
