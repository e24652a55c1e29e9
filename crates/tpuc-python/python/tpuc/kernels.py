"""User kernels in JAX: `jax_op("mylib::name", fn)` makes a JAX function (plain `jax.numpy`, or a
Pallas kernel with `interpret=True`, which runs on any plugin) a torch custom op. Its fake
implementation comes from JAX's shape evaluation; on CPU tensors JAX runs it; wherever tpuc
compiles a graph calling it (the `tpuc` device, `torch.compile(backend="tpuc")`, an exported
program through `compile_exported` or, with `save_kernels`, through `tpuc compile`/`run`), the
function is exported by `jax.export` for the call's shapes and its StableHLO spliced into the
module as a private function called by `func.call`, serialized for the plugin's StableHLO
version. Gradients come from `jax.vjp`, or from a backward the user gives (also a JAX function).

JAX is optional (`pip install 'tpuc[jax]'`); only this module imports it, when first needed.
See docs/kernels.md.
"""
from __future__ import annotations

import functools
import inspect
import json
import os
import shutil
import tempfile
import zipfile

import torch

from . import _tpuc

# The oldest JAX whose `jax.export` (platforms, kept inputs) and StableHLO serialization tpuc uses.
MIN_JAX = (0, 7)
# The archive's extra file the CLI reads (tpuc_fx::kernels::ARCHIVE_ENTRY).
ARCHIVE_ENTRY = "extra/tpuc_kernels.json"
FORMAT = 1

# The kernels registered in this process, by the name graphs give their op's overload
# (`mylib.scale.default`).
_KERNELS: dict[str, "JaxKernel"] = {}
# The torch libraries the ops were defined in (a library unregisters its ops when collected).
_LIBRARIES: dict[str, torch.library.Library] = {}


@functools.cache
def _jax():
    """The `jax` module, checked to be new enough; what to install when it is missing."""
    try:
        import jax
        import jax.export  # noqa: F401 - the submodule tpuc uses
    except ImportError as error:
        raise _tpuc.TpucError(
            "tpuc.jax_op needs JAX, which is not installed: pip install 'tpuc[jax]' "
            f"(JAX {MIN_JAX[0]}.{MIN_JAX[1]} or newer)") from error
    version = tuple(int(p) for p in jax.__version__.split(".")[:2] if p.isdigit())
    if version < MIN_JAX:
        raise _tpuc.TpucError(f"tpuc.jax_op needs JAX {MIN_JAX[0]}.{MIN_JAX[1]} or newer; this is JAX "
                              f"{jax.__version__}: pip install -U 'tpuc[jax]'")
    return jax


def _x64():
    """Where kernels are traced and run: with JAX's 64-bit types, so that a kernel computes in
    the dtypes torch gives it (float64 included), as torch would; the process's own JAX
    setting is left as it is."""
    return _jax().enable_x64(True)


def _jax_dtype(dtype: torch.dtype):
    return _jax().numpy.dtype(str(dtype).removeprefix("torch."))


def _torch_dtype(dtype) -> torch.dtype:
    found = getattr(torch, str(dtype), None)
    if not isinstance(found, torch.dtype):
        raise _tpuc.TpucError(f"a JAX kernel returns {dtype}, which torch has no dtype for")
    return found


def _to_jax(t: torch.Tensor):
    return _jax().numpy.from_dlpack(t.detach().contiguous())


def _to_torch(a) -> torch.Tensor:
    return torch.from_dlpack(a).clone()


class JaxKernel:
    """A registered JAX kernel: its op and function, how many results it returns, and its
    exported StableHLO per signature."""

    def __init__(self, qualname: str, fn, arity: int, outputs: int):
        self.qualname = qualname
        self.fn = fn
        self.arity = arity
        self.outputs = outputs
        self.exported: dict[tuple, dict] = {}
        # For the backward `jax.vjp` makes of a kernel: that kernel's name.
        self.gradient_of: str | None = None

    @property
    def op(self) -> torch._ops.OpOverload:
        namespace, name = self.qualname.split("::")
        return getattr(getattr(torch.ops, namespace), name).default

    def output_types(self, inputs: list[tuple[torch.dtype, tuple]]) -> list[tuple[torch.dtype, tuple]]:
        """The (dtype, shape) of each result for inputs of these types, by JAX's shape evaluation."""
        jax = _jax()
        with _x64():
            structs = [jax.ShapeDtypeStruct(shape, _jax_dtype(dtype)) for dtype, shape in inputs]
        try:
            with _x64():
                out = jax.eval_shape(self.fn, *structs)
        except Exception as error:
            raise self._failed(inputs, error) from error
        return [(_torch_dtype(a.dtype), tuple(a.shape)) for a in self._results(out)]

    def _results(self, out) -> list:
        """The kernel's results as a list, as many as it was registered with."""
        flat = list(out) if isinstance(out, (tuple, list)) else [out]
        if len(flat) != self.outputs:
            raise _tpuc.TpucError(f"{self.qualname}: the kernel returns {len(flat)} arrays; it was registered "
                                  f"with outputs={self.outputs}")
        return flat

    def _failed(self, inputs, error: Exception) -> _tpuc.TpucError:
        hint = "" if self.gradient_of is None else (
            f" (the gradient of {self.gradient_of} by jax.vjp; a Pallas kernel has none of its own: "
            "give tpuc.jax_op a backward)")
        return _tpuc.TpucError(f"{self.qualname}: JAX cannot trace the kernel for {_describe(inputs)}{hint}: {error}")

    def run(self, *args: torch.Tensor):
        """The kernel run by JAX on host tensors (the op's CPU implementation)."""
        try:
            with _x64():
                out = _jitted(self.fn)(*[_to_jax(a) for a in args])
        except Exception as error:
            raise self._failed([(a.dtype, tuple(a.shape)) for a in args], error) from error
        results = [_to_torch(a) for a in self._results(out)]
        return results[0] if self.outputs == 1 else tuple(results)

    def fake(self, *args: torch.Tensor):
        types = self.output_types([(a.dtype, tuple(a.shape)) for a in args])
        device = args[0].device if args else torch.device("cpu")
        results = [torch.empty(shape, dtype=dtype, device=device) for dtype, shape in types]
        return results[0] if self.outputs == 1 else tuple(results)

    def kernel(self, inputs: list[tuple[torch.dtype, tuple]], versions: tuple) -> dict:
        """The kernel for inputs of these types, as the compiler reads it (tpuc_fx::kernels):
        the function exported by `jax.export` and serialized for StableHLO `versions`
        (the plugin's (current, minimum)), its module in MLIR's generic form."""
        key = (tuple((str(d), tuple(s)) for d, s in inputs), versions)
        found = self.exported.get(key)
        if found is None:
            found = self.exported[key] = _export(self, inputs, versions)
        return found


@functools.cache
def _jitted(fn):
    return _jax().jit(fn)


def _describe(inputs) -> str:
    return ", ".join(f"{str(d).removeprefix('torch.')}{list(s)}" for d, s in inputs)


def _version(text: str) -> tuple:
    return tuple(int(p) for p in text.split("."))


def _export(kernel: JaxKernel, inputs: list, versions: tuple) -> dict:
    jax = _jax()
    from jax._src.interpreters import mlir as jax_mlir
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo

    where = f"{kernel.qualname} for {_describe(inputs)}"
    try:
        with _x64():
            structs = [jax.ShapeDtypeStruct(tuple(shape), _jax_dtype(dtype)) for dtype, shape in inputs]
            exported = jax.export.export(_jitted(kernel.fn), platforms=[_platform()])(*structs)
    except Exception as error:
        raise _tpuc.TpucError(f"{where}: jax.export failed: {error}") from error
    if exported.nr_devices != 1 or exported.ordered_effects or exported.unordered_effects:
        raise _tpuc.TpucError(f"{where}: a kernel must be a function of its inputs on one device, without "
                              "effects (no sharding inside it, no callbacks)")
    # Serialized for the newest version both JAX and the plugin know: what the plugin cannot
    # read is refused here, by name, rather than by the plugin's compiler.
    plugin_current, plugin_minimum = versions
    ours = stablehlo.get_current_version()
    target = ours if plugin_current is None or _version(plugin_current) >= _version(ours) else plugin_current
    if plugin_minimum is not None and _version(target) < _version(plugin_minimum):
        raise _tpuc.TpucError(f"{where}: JAX writes StableHLO {ours}, the plugin reads {plugin_minimum} to "
                              f"{plugin_current}")
    try:
        artifact = stablehlo.serialize_portable_artifact_str(exported.mlir_module(), target)
    except Exception as error:
        raise _tpuc.TpucError(
            f"{where}: the kernel uses StableHLO newer than the plugin's {plugin_current} (JAX "
            f"{jax.__version__} writes {ours}); use a JAX whose StableHLO the plugin reads") from error
    with jax_mlir.make_ir_context():
        module = ir.Module.parse(stablehlo.deserialize_portable_artifact_str(artifact))
        text = module.operation.get_asm(print_generic_op_form=True, enable_debug_info=False)
    outputs = [(_torch_dtype(a.dtype), tuple(a.shape)) for a in exported.out_avals]

    def tensor(dtype, shape):
        return {"dtype": str(dtype).removeprefix("torch."), "shape": [int(d) for d in shape]}

    return {"op": str(kernel.op), "inputs": [tensor(*t) for t in inputs], "outputs": [tensor(*t) for t in outputs],
            "operands": [int(i) for i in exported.module_kept_var_idx], "mlir": text, "stablehlo_version": target}


def _platform() -> str:
    """The platform `jax.export` writes the kernel for: the plugin's."""
    from .runtime import session

    platform = session(None).runtime.platform.lower()
    return {"gpu": "cuda"}.get(platform, platform)


def _plugin_versions() -> tuple:
    from .runtime import session

    return tuple(session(None).runtime.stablehlo_versions)


def jax_op(name: str, fn=None, *, outputs: int = 1, backward=None, differentiable: bool = True):
    """Registers the JAX function `fn` as the torch op `name` (`"mylib::scale"`), callable as
    `torch.ops.mylib.scale(...)` and returned. Every positional parameter of `fn` is a tensor
    (bind other arguments with `functools.partial` first); it returns `outputs` arrays.
    `backward`: a JAX function of the inputs followed by the gradients of the results,
    returning one gradient per input; without it gradients come from `jax.vjp` (or none, with
    `differentiable=False`). Without `fn`, a decorator."""
    if fn is None:
        return lambda f: jax_op(name, f, outputs=outputs, backward=backward, differentiable=differentiable)
    _jax()
    namespace, sep, op_name = name.partition("::")
    if not sep or not namespace.isidentifier() or not op_name.isidentifier():
        raise _tpuc.TpucError(f"tpuc.jax_op: the op's name {name!r} is not 'namespace::name'")
    if namespace in ("aten", "prims", "tpuc"):
        raise _tpuc.TpucError(f"tpuc.jax_op: the namespace {namespace!r} is taken; name the op 'mylib::{op_name}'")
    if not isinstance(outputs, int) or outputs < 1:
        raise _tpuc.TpucError(f"tpuc.jax_op: outputs is {outputs!r}; a kernel returns 1 or more arrays")
    parameters = list(inspect.signature(fn).parameters.values())
    if any(p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) or p.default is not p.empty
           for p in parameters):
        raise _tpuc.TpucError(f"tpuc.jax_op({name!r}): every parameter of the kernel is a tensor, positional and "
                              "without a default; bind other arguments with functools.partial first")
    qualname = f"{namespace}::{op_name}"
    if f"{namespace}.{op_name}.default" in _KERNELS:
        raise _tpuc.TpucError(f"tpuc.jax_op: {qualname} is registered already")
    kernel = JaxKernel(qualname, fn, len(parameters), outputs)
    names = [p.name for p in parameters]
    returns = "Tensor" if outputs == 1 else "(" + ", ".join(["Tensor"] * outputs) + ")"
    library = _LIBRARIES.get(namespace)
    if library is None:
        library = _LIBRARIES[namespace] = torch.library.Library(namespace, "FRAGMENT")
    library.define(f"{op_name}({', '.join(f'Tensor {n}' for n in names)}) -> {returns}")
    library.impl(op_name, kernel.run, "CPU")
    torch.library.register_fake(qualname, kernel.fake, lib=library)
    _KERNELS[str(kernel.op)] = kernel
    if differentiable:
        _register_backward(kernel, backward, library)
    return getattr(getattr(torch.ops, namespace), op_name)


def _register_backward(kernel: JaxKernel, backward, library) -> None:
    """The op's gradient: a second kernel (`name_backward`) computing each input's gradient
    from the inputs and the results' gradients, by `backward` or by `jax.vjp`."""
    jax = _jax()
    arity, outputs = kernel.arity, kernel.outputs
    by_vjp = backward is None
    if by_vjp:
        def backward(*args):
            primals, cotangents = args[:arity], args[arity:]
            # Differentiated in its floating inputs only; integer inputs (indices) get zeros,
            # which the op's gradient drops.
            floating = [i for i, p in enumerate(primals) if jax.numpy.issubdtype(p.dtype, jax.numpy.inexact)]

            def of_floats(*xs):
                full = list(primals)
                for i, x in zip(floating, xs):
                    full[i] = x
                return kernel.fn(*full)

            _, pullback = jax.vjp(of_floats, *[primals[i] for i in floating])
            grads = pullback(cotangents[0] if outputs == 1 else tuple(cotangents))
            result = [jax.numpy.zeros_like(p) for p in primals]
            for i, g in zip(floating, grads):
                result[i] = g
            return tuple(result)
    parameters = [f"x{i}" for i in range(arity)] + [f"g{i}" for i in range(outputs)]
    # `jax_op` reads the parameters from the signature; this one's come from the op's.
    namespace, name = kernel.qualname.split("::")
    backward_op = jax_op(f"{namespace}::{name}_backward",
                         _with_parameters(backward, parameters), outputs=arity, differentiable=False)
    if by_vjp:
        _KERNELS[str(backward_op.default)].gradient_of = kernel.qualname

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)
        results = [output] if outputs == 1 else list(output)
        ctx.result_types = [(r.shape, r.dtype, r.device) for r in results]

    def gradients(ctx, *grads):
        inputs = ctx.saved_tensors
        # A result nothing used has no gradient: zeros, as the kernel's backward takes one.
        grads = [g if g is not None else torch.zeros(shape, dtype=dtype, device=device)
                 for g, (shape, dtype, device) in zip(grads, ctx.result_types)]
        results = backward_op(*inputs, *grads)
        results = [results] if arity == 1 else list(results)
        return tuple(r if i.dtype.is_floating_point or i.dtype.is_complex else None
                     for r, i in zip(results, inputs))

    torch.library.register_autograd(kernel.qualname, gradients, setup_context=setup_context, lib=library)


def _with_parameters(fn, names: list[str]):
    """`fn` (taking `*args`) as a function with these positional parameters."""
    def wrapper(*args):
        return fn(*args)
    wrapper.__signature__ = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_ONLY) for n in names])
    return wrapper


def registered(op_name: str) -> bool:
    """Whether `op_name` (`mylib.scale.default`) is a registered JAX kernel's op."""
    return op_name in _KERNELS


def calls_kernels(gm: torch.fx.GraphModule) -> bool:
    """Whether `gm` or a subgraph of it calls a registered JAX kernel."""
    return bool(_KERNELS) and any(
        node.op == "call_function" and str(node.target) in _KERNELS
        for module in gm.modules() if isinstance(module, torch.fx.GraphModule) for node in module.graph.nodes)


def _node_kernels(gm: torch.fx.GraphModule, versions) -> list[dict]:
    """The kernels the calls in `gm` and its subgraphs need, one per op and signature."""
    found: dict[tuple, dict] = {}
    for module in gm.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for node in module.graph.nodes:
            kernel = _KERNELS.get(str(node.target)) if node.op == "call_function" else None
            if kernel is None:
                continue
            values = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in node.args]
            if not all(isinstance(v, torch.Tensor) for v in values) or node.kwargs:
                raise _tpuc.TpucError(f"{node.name}: {kernel.qualname} takes tensors only")
            if any(not isinstance(d, int) for v in values for d in v.shape):
                raise _tpuc.TpucError(f"{node.name}: {kernel.qualname} is called with symbolic sizes "
                                      f"({_describe([(v.dtype, tuple(v.shape)) for v in values])}); a JAX "
                                      "kernel is made for static shapes (mark no dimension dynamic)")
            inputs = [(v.dtype, tuple(v.shape)) for v in values]
            entry = kernel.kernel(inputs, versions)
            found[(entry["op"], json.dumps(entry["inputs"]))] = entry
    return list(found.values())


def document(gm: torch.fx.GraphModule, versions=None) -> dict | None:
    """The kernels document (tpuc_fx::kernels) of the JAX kernels `gm` calls; None when it
    calls none (then JAX is not imported)."""
    if not _KERNELS:
        return None
    kernels = _node_kernels(gm, versions if versions is not None else _plugin_versions())
    return {"format": FORMAT, "kernels": kernels} if kernels else None


def save_kernels(program: torch.export.ExportedProgram, path: str | os.PathLike, *,
                 stablehlo_version: str | None = None) -> int:
    """Writes the JAX kernels `program` calls into the archive `path` (which `torch.export.save`
    wrote for it), as its extra file `tpuc_kernels.json`, so that `tpuc compile` and `tpuc run`
    find them without Python. Each is serialized for the StableHLO of this process's plugin, or
    for `stablehlo_version`. Returns how many kernels it wrote; an earlier set is replaced."""
    path = os.fspath(path)
    if not isinstance(program, torch.export.ExportedProgram):
        raise TypeError(f"tpuc.save_kernels takes a torch.export.ExportedProgram, not {type(program).__name__}")
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as error:
        raise _tpuc.TpucError(f"tpuc.save_kernels: {path} is no archive torch.export.save wrote: {error}") from error
    versions = (stablehlo_version, None) if stablehlo_version is not None else None
    found = document(program.graph_module, versions)
    with archive:
        names = archive.namelist()
        model = next((n for n in names if n.endswith("models/model.json")), None)
        if model is None:
            raise _tpuc.TpucError(f"tpuc.save_kernels: {path} has no models/model.json (is it a torch.export archive?)")
        entry = model.removesuffix("models/model.json") + ARCHIVE_ENTRY
        handle, temporary = tempfile.mkstemp(prefix=".tpuc-kernels-", dir=os.path.dirname(os.path.abspath(path)))
        os.close(handle)
        try:
            with zipfile.ZipFile(temporary, "w") as out:
                for info in archive.infolist():
                    if info.filename != entry:
                        with archive.open(info) as source, out.open(info, "w") as target:
                            shutil.copyfileobj(source, target, 1 << 20)
                if found is not None:
                    out.writestr(entry, json.dumps(found))
            os.replace(temporary, path)
        finally:
            if os.path.exists(temporary):
                os.remove(temporary)
    return 0 if found is None else len(found["kernels"])
