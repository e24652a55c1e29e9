"""tpuc: PyTorch programs lowered to StableHLO and run on PJRT plugins (XLA CPU, TPU, GPU).

Use it as a torch.compile backend; no import is needed, the backend is registered through the
``torch_dynamo_backends`` entry point::

    compiled = torch.compile(model, backend="tpuc", options={"plugin": "cpu"})

See ``tpuc.backend.Options`` for the options.
"""
from ._tpuc import TpucError, supported_ops
from .backend import Options, tpuc_backend

__all__ = ["Options", "TpucError", "supported_ops", "tpuc_backend"]
