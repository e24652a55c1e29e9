"""The device's torch.distributed backend, `tpuc`: `init_process_group()` picks it for tpuc
tensors (as NCCL for CUDA), and `init_process_group("tpuc")` for tpuc and CPU tensors alike.
Every collective runs on gloo, the engine that owns the transport; the native layer
(`native/distributed.cpp`) reads device tensors to the host for it and writes its results back."""
import datetime

import torch
import torch.distributed as dist

from . import _tpuc_native

NAME = "tpuc"


def register() -> None:
    """Registers the backend for the tpuc device (and the host, whose tensors pass straight to
    gloo), unless this torch has no torch.distributed."""
    if not dist.is_available() or not dist.is_gloo_available():
        return
    _tpuc_native.enable_distributed()
    dist.Backend.register_backend(NAME, _create, extended_api=True, devices=[NAME, "cpu"])


def _create(options, backend_options) -> torch.distributed.Backend:
    """The backend of one process group: a gloo backend of the same ranks, under a store prefix
    of its own, wrapped for device tensors."""
    if backend_options is not None:
        raise ValueError(f"tpuc: the {NAME} process-group backend takes no backend options "
                         f"(got {type(backend_options).__name__}); its engine is gloo's defaults")
    timeout = options.timeout if isinstance(options.timeout, datetime.timedelta) else \
        datetime.timedelta(minutes=30)
    host = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", options.store), options.group_rank,
                                 options.group_size, timeout)
    host.options.global_ranks_in_group = options.global_ranks_in_group
    host.options.group_name = options.group_id
    return _tpuc_native.device_backend(host, timeout)
