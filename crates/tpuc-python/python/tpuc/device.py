"""The `tpuc` device: PyTorch's PrivateUse1 device given the native layer's kernels, guard and
hooks (`_tpuc_native`, built from native/), connected to the session's runtime, the planner and
the fuser; its modes (strict, `debug`, `fused`); and the device as the compile backend sees it
(`DeviceHooks`): a compiled graph over device tensors runs on their storages' values and
returns device tensors."""
from __future__ import annotations

import atexit
import functools

import torch

from . import (
    _tpuc,
    _tpuc_native,
    accelerator,
    autocast,
    checks,
    default_compiler,
    flex_attention,
    fusion,
    op_tracing,
    planner,
    process_group,
)
from .runtime import DeviceHooks, attach_device, dtype_name, session

NAME = accelerator.NAME


def _session():
    return session(None)


def _connect() -> None:
    """Connects the native layer to the session's runtime and the planner."""
    runtime = _session().runtime
    names = _tpuc.element_types()
    codes = []
    for dtype in _tpuc_native.scalar_types():
        try:
            codes.append(names.index(dtype_name(dtype)) if dtype is not None else -1)
        except (ValueError, _tpuc.TpucError):
            codes.append(-1)
    _tpuc_native.init(_tpuc.native_api(), runtime.native_target(), runtime.each_devices, codes, planner, fusion.fuse)
    # Tensors freed while the interpreter exits, after the plugin, are not released into it.
    atexit.register(_tpuc_native.shutdown)


def debug(on: bool = True, *, finite: bool = False, compare: bool = False, rtol: float = 1e-4,
          atol: float = 1e-5) -> None:
    """Debug mode (`checks.py`): every op's results are read back when it runs, so that an error
    names the op and the line of the user's code that ran it; `finite` stops at the first op that
    makes a NaN or an infinity from finite inputs; `compare` runs every op on the CPU too and stops
    at the first whose result differs beyond `rtol`/`atol`, saying by how much. `debug(False)`
    returns to strict mode; turning it on leaves fused mode."""
    if on:
        _tpuc_native.set_fused(False, 1)
    checks.debug(on, finite=finite, compare=compare, rtol=rtol, atol=atol)


_OPTIMIZER_HOOK: list = []


def fused(on: bool = True, *, max_ops: int = 1000) -> None:
    """Fused mode (native/fusion.h): ops are recorded, not run, until a value is needed
    (`.cpu()`, `.item()`, printing, a branch on a value, `torch.tpuc.synchronize()`), after each
    optimizer step, and every `max_ops` ops; each recorded run is compiled as one program, cached
    by its structure. `fused(False)` runs what was recorded and returns to strict mode; turning it
    on leaves debug mode."""
    if isinstance(max_ops, bool) or not isinstance(max_ops, int) or max_ops < 1:
        raise _tpuc.TpucError(f"fused mode: max_ops must be a positive integer, not {max_ops!r}")
    if on:
        checks.debug(False)
        if not _OPTIMIZER_HOOK:
            # An optimizer step ends a run: each step of a training loop records the same ops.
            from torch.optim.optimizer import register_optimizer_step_post_hook
            _OPTIMIZER_HOOK.append(register_optimizer_step_post_hook(lambda *_: _tpuc_native.flush()))
    _tpuc_native.set_fused(on, max_ops)


def cache_stats() -> dict:
    """What the device's cache of op plans did: the native layer's hits and misses (a miss
    plans), the ops run on the host, fused mode's runs and their programs, the copies from the
    host to the device (`uploads`, `uploaded_bytes`) and the seconds planning took."""
    stats = {**_tpuc_native.cache_stats(), **planner.STATS}
    stats["requests"] = stats["hits"] + stats["misses"]
    return stats


def graph_device(values: list) -> int:
    """The device a compiled graph with arguments `values` runs on: its device tensors' (the
    current device when it has none)."""
    return next((v.device.index for v in values if isinstance(v, torch.Tensor) and v.device.type == NAME),
                torch.tpuc.current_device())


def graph_argument(value, cache, device: int) -> _tpuc.DeviceBuffer:
    """The buffer a compiled graph over the device's tensors runs on (on device number `device`)
    for its argument `value`: a device tensor's dense value (its storage's own when it is the
    whole of it); a host tensor is put on the device, `cache` keeping it."""
    if isinstance(value, torch.Tensor) and value.device.type == NAME:
        if value.device.index != device:
            raise _tpuc.TpucError(f"a graph compiled over the tpuc device's tensors got tensors of {NAME}:{device} "
                                  f"and {value.device}: its device tensors must all be on one device")
        return _tpuc.DeviceBuffer.from_native(_tpuc_native.dense_value(value))
    if isinstance(value, torch.Tensor) and value.device.type != "cpu":
        raise _tpuc.TpucError(f"a graph compiled over the tpuc device's tensors got a tensor of the {value.device.type} "
                              "device: its arguments are the tpuc device's tensors or the host's")
    return cache.buffer(value, None, device)


def graph_result(buffer: _tpuc.DeviceBuffer, dtype: torch.dtype, shape, device_type: str, device: int):
    """A compiled graph's result as its traced value was: a tensor of device number `device`
    holding the buffer, or a host tensor."""
    if device_type == "cpu":
        out = torch.empty(shape, dtype=dtype)
        buffer.copy_to_host(out.data_ptr(), out.numel() * out.element_size())
        return out
    return _tpuc_native.wrap(buffer.native_value(), dtype, list(shape), device)


def _eager(module: torch.fx.GraphModule):
    """A partitioned graph's uncompiled nodes run op by op on the device: its tensors are the
    device's own, so the graph runs as it is."""
    return module.forward


@functools.cache
def hide_from_dynamo() -> None:
    """Keeps Dynamo out of the device's own Python (the planner runs when an op meets a new key)."""
    from torch._dynamo import trace_rules

    for module in (__name__, planner.__name__, fusion.__name__, checks.__name__, op_tracing.__name__):
        trace_rules.add(module)


def register() -> None:
    """Makes PyTorch's PrivateUse1 device the native `tpuc` device (`accelerator.claim_device`):
    its name, the native layer's kernels, guard and hooks, `torch.tpuc` and autocast."""
    def native_backend() -> None:
        accelerator.attach(cache_stats=cache_stats, flush=_tpuc_native.flush, guard=True)
        torch.utils.rename_privateuse1_backend(NAME)
        torch.utils.generate_methods_for_privateuse1_backend()
        torch._register_device_module(NAME, accelerator)
        accelerator.identify_in_dlpack()
        _connect()
        autocast.register()
        process_group.register()
        flex_attention.register()
        default_compiler.register()

    attach_device(DeviceHooks(session=_session, argument=graph_argument, result=graph_result,
                              device_of=graph_device, eager=_eager,
                              hide_from_dynamo=hide_from_dynamo))
    accelerator.claim_device(native_backend)


