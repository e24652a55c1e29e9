"""tpuc: PyTorch programs lowered to StableHLO and run on PJRT plugins (XLA CPU, TPU, GPU).

Use it as a torch.compile backend; no import is needed, the backend is registered through the
``torch_dynamo_backends`` entry point::

    compiled = torch.compile(model, backend="tpuc", options={"plugin": "cpu"})

See ``tpuc.backend.Options`` for the options. Over a mesh of devices::

    compiled = torch.compile(model, backend="tpuc", options={"mesh": "fsdp=2,tp=2", "plan": "fsdp,tp"})

or lay parts out yourself with ``tpuc.Mesh``, ``tpuc.mark_sharding``, ``tpuc.shard`` and, inside a
model, ``tpuc.sharding_constraint`` (docs/sharding.md). ``tpuc.spmd(fn, mesh)`` runs one rank's
program of a torch.distributed computation (DTensor, functional collectives) on every device.

Ahead of time, ``tpuc.compile_exported(exported_program)`` compiles a ``torch.export`` program
for a plugin and returns a callable (``.stablehlo()``, ``.save(path)``, ``tpuc.load(path)``).

``tpuc.jax_op("mylib::name", fn)`` makes a JAX function (or a Pallas kernel) a torch op that every
path above compiles into its programs (docs/kernels.md).
"""
import importlib


def _autoload() -> None:
    """torch's `torch.backends` entry point (defined before anything imports torch, which calls
    it): importing this package makes the device available."""


import torch as _torch  # noqa: E402  (after _autoload, which torch may call first)


def _native_layer_error(why: str) -> ImportError:
    return ImportError(f"tpuc: the tpuc device's native layer (tpuc/_tpuc_native) does not work with torch "
                       f"{_torch.__version__} ({why}); it is built for one torch version: rebuild it "
                       "(bash tools/setup.sh) or install the torch version tpuc was built with")


try:
    from . import _tpuc_native  # noqa: E402
except ImportError as error:
    raise _native_layer_error(str(error)) from error
if _tpuc_native.torch_version != _torch.__version__:
    raise _native_layer_error(f"it was built with torch {_tpuc_native.torch_version}")

from . import device as _device  # noqa: E402

_device.register()

# The package's names, each imported from its module when first used: `import tpuc` (for the
# device) stays cheap, and the compile backend (Dynamo, aot_autograd) is imported when a program
# uses it.
_WHERE = {
    "TpucError": "._tpuc", "LoweringError": "._tpuc", "UnsupportedOpsError": "._tpuc",
    "DynamicSizeError": "._tpuc", "PluginError": "._tpuc", "supported_ops": "._tpuc", "cache_stats": "._tpuc",
    "Options": ".backend", "tpuc_backend": ".backend",
    "RankProgram": ".ranks", "process_groups": ".ranks", "spmd": ".ranks",
    "Mesh": "._tpuc", "Plan": "._tpuc", "mark_sharding": ".sharding", "shard": ".sharding",
    "sharding_constraint": ".sharding",
    "compile_exported": ".exported", "load": ".exported", "CompiledProgram": ".exported",
    "doctor": ".diagnosis", "DoctorReport": ".diagnosis",
    "jax_op": ".kernels", "save_kernels": ".kernels",
}

__all__ = sorted(_WHERE)


_SUBMODULES = {"backend", "compiler", "decompositions", "exported", "graph", "kernels", "options", "ranks", "runtime",
               "sharding"}


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'tpuc' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
