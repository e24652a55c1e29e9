"""tpuc: PyTorch programs lowered to StableHLO and run on PJRT plugins (XLA CPU, TPU, GPU).

Use it as a torch.compile backend; no import is needed, the backend is registered through the
``torch_dynamo_backends`` entry point::

    compiled = torch.compile(model, backend="tpuc", options={"plugin": "cpu"})

See ``tpuc.backend.Options`` for the options. Over a mesh of devices::

    compiled = torch.compile(model, backend="tpuc", options={"mesh": "fsdp=2,tp=2", "plan": "fsdp,tp"})

or lay parts out yourself with ``tpuc.Mesh``, ``tpuc.mark_sharding``, ``tpuc.shard`` and, inside a
model, ``tpuc.sharding_constraint`` (docs/sharding.md). ``tpuc.spmd(fn, mesh)`` runs one rank's
program of a torch.distributed computation (DTensor, functional collectives) on every device.
"""
from ._tpuc import TpucError, supported_ops
from .backend import Options, tpuc_backend
from .ranks import RankProgram, process_groups, spmd
from .sharding import Mesh, mark_sharding, shard, sharding_constraint
from . import device as _device

_device.enable()

__all__ = ["Mesh", "Options", "RankProgram", "TpucError", "mark_sharding", "process_groups", "shard",
           "sharding_constraint", "spmd", "supported_ops", "tpuc_backend"]
