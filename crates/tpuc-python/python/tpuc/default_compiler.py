"""torch.compile's default compiler on the tpuc device. `torch.compile(fn)` names inductor, which
generates code for the devices it has code generators for (CUDA, CPU, ...) and has none for this
one; a graph Dynamo captures over the device's tensors is compiled by tpuc's backend instead (its
default options; inductor's options, which configure inductor's code generation, do not apply).
Graphs over other devices' tensors still go to inductor. Programs written for CUDA that compile
pieces with the default backend (TorchTitan's FlexAttention and block masks) run unchanged."""
from __future__ import annotations

import functools
import logging

import torch

from .accelerator import NAME

_LOG = logging.getLogger(__name__)


def on_device(gm: torch.fx.GraphModule, example_inputs) -> bool:
    """Whether the graph computes on the device: one of its inputs is a device tensor, or a
    value it makes is (a graph without tensor inputs makes its tensors on some device)."""
    def is_device_tensor(value) -> bool:
        return isinstance(value, torch.Tensor) and value.device.type == NAME

    if any(is_device_tensor(value) for value in example_inputs):
        return True
    for node in gm.graph.nodes:
        value = node.meta.get("example_value", node.meta.get("val"))
        if any(is_device_tensor(v) for v in (value if isinstance(value, (tuple, list)) else (value,))):
            return True
    return False


@functools.cache
def _announce() -> None:
    _LOG.info("tpuc: graphs over tpuc tensors given to torch.compile's default backend (inductor) are compiled by tpuc")


@functools.cache
def register() -> None:
    """Hands graphs over the device's tensors from torch.compile's inductor backend to tpuc's."""
    wrapper = torch._TorchCompileInductorWrapper
    inductor_call = wrapper.__call__

    @functools.wraps(inductor_call)
    def call(self, model_, inputs_, **kwargs):
        if not on_device(model_, inputs_):
            return inductor_call(self, model_, inputs_, **kwargs)
        from torch._dynamo import lookup_backend

        _announce()
        if self.config:
            _LOG.debug("tpuc: inductor's options %s do not apply to a graph tpuc compiles", sorted(self.config))
        return lookup_backend(NAME)(model_, inputs_)

    wrapper.__call__ = call
