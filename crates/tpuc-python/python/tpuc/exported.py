"""The ahead-of-time path from Python: `compile_exported` compiles a `torch.export` program (an
`ExportedProgram`, or a `.pt2` / `.fx` file) for a PJRT plugin and returns a callable taking and
returning torch tensors, its weights uploaded once; `CompiledProgram.save` and `load` keep it
with its compiled executables. The compiling and running are `tpuc run`'s (the same Rust
runner), so its errors are the CLI's. See docs/python-api.md."""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

import torch

from . import _tpuc, kernels
from .runtime import DTYPES, dtype_name

_SAVED_FORMAT = 1
_PROGRAM = "program.pt2"
_EXECUTABLES = "executables"
_MANIFEST = "tpuc.json"


def compile_exported(program, *, plugin: str | None = None, matmul_precision: str = "highest",
                     hoist_weights: bool = True, cache_dir: str | None = None,
                     sizes: dict[str, int] | None = None, mesh: "str | _tpuc.Mesh | None" = None, plan: str | None = None,
                     seed: int = 0, fusion: str | None = None) -> "CompiledProgram":
    """`program` compiled for `plugin` and loaded there, ready to call.

    program:          a `torch.export.ExportedProgram`, or the path of a `.pt2` archive (or a
                      `.fx` file).
    plugin:           the PJRT plugin: a name (cpu, tpu, cuda) or a path; default
                      $TPUC_PJRT_PLUGIN, else cpu (as the backend's and the CLI's option).
    matmul_precision: highest, high or default (`tpuc compile --matmul-precision`).
    hoist_weights:    compute what the program derives from its weights alone once.
    cache_dir:        the cache of compiled executables ($TPUC_CACHE_DIR or the default when
                      None; "off" for none).
    sizes:            a dynamic program's symbolic sizes, by symbol ({"s0": 8}); the others are
                      the sizes it was exported with.
    mesh, plan:       run over a mesh of devices (`"dp=2"`, `"fsdp=2,tp=2"`) laid out by a plan
                      (`"dp"`, `"fsdp,tp"`, or a plan file), as `tpuc run --mesh --plan`.
    seed:             the seed of the program's random ops.
    fusion:           "kernels" (default when None), "patterns" or "none" (`tpuc compile --fusion`).
    """
    own = None
    if isinstance(program, torch.export.ExportedProgram):
        own = tempfile.mkdtemp(prefix="tpuc-program-")
        path = os.path.join(own, _PROGRAM)
        torch.export.save(program, path)
        if kernels.calls_kernels(program.graph_module):
            kernels.save_kernels(program, path)
    elif isinstance(program, (str, os.PathLike)):
        path = os.fspath(program)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"tpuc.compile_exported: no such file: {path}")
    else:
        raise TypeError("tpuc.compile_exported takes a torch.export.ExportedProgram or the path of a .pt2 or .fx "
                        f"file, not {type(program).__name__}")
    options = {"plugin": plugin, "matmul_precision": matmul_precision, "hoist_weights": bool(hoist_weights),
               "cache_dir": cache_dir, "sizes": _sizes(sizes), "mesh": None if mesh is None else str(mesh),
               "plan": plan, "seed": int(seed), "fusion": fusion}
    try:
        return CompiledProgram(path, options, own)
    except BaseException:
        if own is not None:
            shutil.rmtree(own, ignore_errors=True)
        raise


def load(path: str, *, plugin: str | None = None, recompile: bool = False) -> "CompiledProgram":
    """A program saved by `CompiledProgram.save`, its executables loaded, not compiled again.
    They are checked against the plugin (its build, the options, tpuc's version: the cache
    key): one compiled for another is an error unless `recompile`, which compiles it there.
    `plugin` overrides the saved plugin's name."""
    manifest_path = os.path.join(os.fspath(path), _MANIFEST)
    try:
        with open(manifest_path) as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"tpuc.load: {path} is not a saved tpuc program (no {_MANIFEST})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise _tpuc.TpucError(f"tpuc.load: {manifest_path} is damaged: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != _SAVED_FORMAT:
        raise _tpuc.TpucError(f"tpuc.load: {manifest_path} is not in the format this tpuc reads "
                              f"(format {_SAVED_FORMAT})")
    options = dict(manifest["options"])
    if plugin is not None:
        options["plugin"] = plugin
    options["cache_dir"] = os.path.join(os.fspath(path), _EXECUTABLES)
    program = CompiledProgram(os.path.join(os.fspath(path), _PROGRAM), options, None)
    if program.cache != "hit" and not recompile:
        raise _tpuc.TpucError(
            f"tpuc.load: the executable saved in {path} was compiled for {manifest['platform']} with "
            f"{manifest['plugin']} (tpuc {manifest['tpuc']}), not for this plugin and tpuc: pass "
            "recompile=True to compile it here")
    return program


def _sizes(sizes) -> dict:
    if sizes is None:
        return {}
    if not isinstance(sizes, dict) or not all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
                                              for k, v in sizes.items()):
        raise TypeError(f"sizes maps symbols to sizes ({{'s0': 8}}), not {sizes!r}")
    return dict(sizes)


class CompiledProgram:
    """A compiled exported program: call it with the program's user inputs (torch tensors, in
    the order of `inputs`); it returns its outputs as CPU tensors (one tensor, or a tuple)."""

    def __init__(self, path: str, options: dict, own_dir: str | None):
        self._path, self._options, self._own_dir = path, options, own_dir
        self._program = _tpuc.ExportedProgram(path, search_paths=[p for p in sys.path if p], **options)

    def __del__(self):
        if getattr(self, "_own_dir", None):
            shutil.rmtree(self._own_dir, ignore_errors=True)

    def __call__(self, *args):
        expected = self._program.inputs
        if len(args) != len(expected):
            names = ", ".join(name for name, _, _ in expected)
            raise TypeError(f"the program takes {len(expected)} input(s) ({names}), {len(args)} given")
        tensors = []
        for i, (value, (name, _, _)) in enumerate(zip(args, expected)):
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"input {i} ({name}) is a {type(value).__name__}, not a tensor")
            tensors.append(value.detach().cpu().contiguous())
        results = self._program.run([(t.data_ptr(), t.numel() * t.element_size(), dtype_name(t.dtype),
                                      list(t.shape)) for t in tensors])
        outputs = tuple(torch.frombuffer(data, dtype=DTYPES[dtype]).reshape(shape) if data
                        else torch.empty(shape, dtype=DTYPES[dtype]) for dtype, shape, data in results)
        return outputs[0] if len(outputs) == 1 else outputs

    @property
    def inputs(self) -> list[tuple[str, torch.dtype, list[int]]]:
        """The program's user inputs: (name, dtype, shape) each."""
        return [(name, DTYPES[dtype], shape) for name, dtype, shape in self._program.inputs]

    @property
    def outputs(self) -> list[tuple[torch.dtype, list[int]]]:
        """The program's outputs: (dtype, shape) each."""
        return [(DTYPES[dtype], shape) for dtype, shape in self._program.outputs]

    @property
    def cache(self) -> str:
        """What the cache of compiled executables did: hit, stored, not stored: why, or off."""
        return self._program.cache

    @property
    def platform(self) -> str:
        return self._program.platform

    def stablehlo(self, format: str = "text", *, weights: str = "args"):
        """The program as a StableHLO module: MLIR text (`format="text"`, a str; the module the
        plugin compiled when `weights="args"`) or bytecode (`"bytecode"`, bytes); its weights
        arguments of `main` (`"args"`) or constants in it (`"inline"`)."""
        if format not in ("text", "bytecode"):
            raise ValueError(f"format is 'text' or 'bytecode', not {format!r}")
        if weights not in ("args", "inline"):
            raise ValueError(f"weights is 'args' or 'inline', not {weights!r}")
        if format == "text" and weights == "args":
            return self._program.stablehlo
        module = bytes(self._program.emit(format == "bytecode", weights == "inline"))
        return module.decode() if format == "text" else module

    def save(self, path: str) -> None:
        """Writes the program, its options and its compiled executables to the directory `path`
        (created; an existing one is replaced), for `tpuc.load`."""
        path = os.fspath(path)
        if os.path.exists(path):
            if not os.path.isfile(os.path.join(path, _MANIFEST)):
                raise FileExistsError(f"{path} exists and is not a saved tpuc program: not replacing it")
            shutil.rmtree(path)
        os.makedirs(path)
        shutil.copyfile(self._path, os.path.join(path, _PROGRAM))
        options = dict(self._options, cache_dir=os.path.join(path, _EXECUTABLES))
        # The executables, stored in the directory's own cache (what compiling there finds).
        saved = CompiledProgram(os.path.join(path, _PROGRAM), options, None)
        if saved.cache.startswith("not stored"):
            raise _tpuc.TpucError(f"cannot save the executable in {path}: {saved.cache}")
        from importlib.metadata import version

        manifest = {"format": _SAVED_FORMAT, "tpuc": version("tpuc"), "platform": saved.platform,
                    "plugin": self._options["plugin"] or os.environ.get("TPUC_PJRT_PLUGIN") or "cpu",
                    "options": {k: v for k, v in self._options.items() if k != "cache_dir"}}
        with open(os.path.join(path, _MANIFEST), "w") as f:
            json.dump(manifest, f, indent=1)

    def __repr__(self) -> str:
        inputs = ", ".join(f"{name}: {str(dtype).removeprefix('torch.')}{shape}" for name, dtype, shape in self.inputs)
        return f"<tpuc.CompiledProgram ({inputs}) on {self.platform}>"
