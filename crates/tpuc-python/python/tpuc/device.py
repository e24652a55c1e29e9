"""The `tpuc` eager device: tensors whose data are PJRT device buffers, each ATen op run on the
device through tpuc's own lowering and runtime (strict eager: every op compiled alone, once per
op, argument types and non-tensor arguments, then executed; results stay on the device).

The mechanism is a wrapper tensor subclass (no C++, no allocator): PyTorch's PrivateUse1 device,
renamed `tpuc`, gives the tensors their device; `__torch_dispatch__` receives every ATen op on
them; factory functions (`torch.ones(..., device="tpuc")`) reach kernels registered for the
PrivateUse1 key. Why this and not a C++ backend: docs/ARCHITECTURE.md ("The tpuc device").

Aliasing follows PyTorch's: a tensor is a view (sizes, strides, offset) of a storage that holds
one device buffer; views share the storage; an in-place op computes its new value functionally
and writes it into the storage (the whole buffer replaced, or the view's elements scattered into
it), so every view of the storage sees it. Buffers themselves never change.
"""
from __future__ import annotations

import functools
import os
import time
import warnings
import weakref

import torch
from torch.utils._python_dispatch import return_and_correct_aliasing
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from . import _tpuc, accelerator, autocast, fusion, op_tracing
from .runtime import STATS, DeviceHooks, attach_device, dtype_name, session

NAME = accelerator.NAME


def _register_device() -> None:
    """The device as a backend registered from Python (`accelerator.claim_device`): its name,
    `torch.tpuc`, the device guard and hooks PyTorch expects of a backend, and its kernels."""
    accelerator.attach(cache_stats=cache_stats)
    torch.utils.backend_registration._setup_privateuseone_for_python_backend(
        rename=NAME, backend_module=accelerator)
    global _DEVICE
    _DEVICE = torch.device(NAME, 0)
    _register_kernels()
    autocast.register()


class _Storage:
    """The device memory a tensor and its views share: one dense, row-major buffer of `shape`
    (in fused mode, perhaps one that recorded ops will compute: a `fusion.Pending`)."""

    __slots__ = ("buffer", "shape", "dtype", "numel", "meta", "meta_key", "meta_uses")

    def __init__(self, buffer, shape: list, dtype: torch.dtype):
        self.buffer, self.shape, self.dtype = buffer, list(shape), dtype
        self.numel = 1
        for size in shape:
            self.numel *= size
        # A meta tensor of its size its tensors' meta views share (`_meta_of`), made when needed,
        # the address of its storage and the count of references to that storage it alone makes.
        self.meta, self.meta_key, self.meta_uses = None, 0, 0

    def value(self):
        """Its buffer, or the recorded value it will be (once computed, its buffer)."""
        value = self.buffer
        if type(value) is fusion.Pending and value.buffer is not None:
            self.buffer = value = value.buffer
        return value


def _is_plain(storage: _Storage, size, stride, offset: int) -> bool:
    """Whether a layout is its storage's whole buffer, in its shape."""
    return offset == 0 and list(size) == storage.shape and list(stride) == _contiguous_strides(size)


def _contiguous_strides(shape) -> list:
    strides, step = [], 1
    for size in reversed(list(shape)):
        strides.append(step)
        step *= max(size, 1)
    return strides[::-1]


_DEVICE = None  # torch.device("tpuc", 0), once the device has its name
# The longest chain of views a view is read through by replaying them (`_value`); a longer one
# is read by its sizes and strides.
_VIEW_CHAIN = 16


class TpucTensor(torch.Tensor):
    """A tensor on the tpuc device: a view (its sizes, strides and offset) of a `_Storage`, and
    for a view made by a view op, that op (`_tpuc_view`: op, arguments, which output)."""

    @staticmethod
    def __new__(cls, storage: _Storage, size, stride, offset: int, requires_grad: bool = False,
                plain: bool | None = None, view: tuple | None = None, depth: int = 0):
        tensor = torch.Tensor._make_wrapper_subclass(
            cls, size, strides=stride, storage_offset=offset, dtype=storage.dtype,
            device=_DEVICE, requires_grad=requires_grad)
        tensor._tpuc_storage = storage
        # Whether it is its storage's whole buffer, in its shape (its layout never changes).
        tensor._tpuc_plain = _is_plain(storage, size, stride, offset) if plain is None else plain
        tensor._tpuc_view, tensor._tpuc_depth = view, depth
        tensor._tpuc_inner = None
        return tensor

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if _is_traced(args):
            return _traced_op(func, args, kwargs or {})
        return _dispatch(func, args, kwargs or {})

    # torch.compile sees a tensor of the device as a traceable wrapper subclass whose one inner
    # tensor is a meta tensor of its layout (`_tpuc_meta`): the graph aot_autograd hands the
    # backend is traced on those, and called with them, each naming the device tensor whose
    # buffer it runs on (`graph_argument`); it returns new ones naming its results
    # (`graph_result`). Nothing is copied.
    def __tensor_flatten__(self):
        return ["_tpuc_meta"], None

    @staticmethod
    def __tensor_unflatten__(inner_tensors, context, outer_size, outer_stride):
        inner = inner_tensors["_tpuc_meta"]
        if type(inner) is not torch.Tensor:
            return _traced(inner, outer_size, outer_stride)  # a fake or functional tensor
        return _owner(inner)

    @property
    def _tpuc_meta(self) -> torch.Tensor:
        """The meta tensor standing for this one in compiled graphs (one per tensor; views of
        one storage are views of one meta storage, so that aot_autograd sees them alias)."""
        inner = self._tpuc_inner
        if inner is None:
            inner = self._tpuc_inner = _stand_in(self)
            inner._tpuc_owner = weakref.ref(self)
        return inner

    def __repr__(self, *, tensor_contents=None):
        if self._tpuc_storage is None:
            return f"TpucTensor(traced, size={list(self.shape)}, dtype={self.dtype})"
        # As PyTorch prints a tensor of another device: the device, then the dtype, then autograd.
        text = torch._tensor_str._str(self.detach().cpu())[:-1]
        device = f", device='{self.device}'"
        at = text.rfind(", dtype=")
        text = text + device if at < 0 else text[:at] + device + text[at:]
        if self.grad_fn is not None:
            text += f", grad_fn=<{type(self.grad_fn).__name__}>"
        elif self.requires_grad:
            text += ", requires_grad=True"
        return text + ")"

    def plain(self) -> bool:
        """Whether the tensor is its storage's whole buffer, in its shape."""
        return self._tpuc_plain


def _traced(inner: torch.Tensor, size, stride) -> TpucTensor:
    """A tensor of the device as Dynamo and aot_autograd trace it: no storage, its inner tensor
    a fake (or functional) meta tensor; an op on it is that op on its inner tensor (`_traced_op`).
    (Of the same type as the device's tensors: aot_autograd checks its inputs' types.)"""
    tensor = torch.Tensor._make_wrapper_subclass(
        TpucTensor, size, strides=stride, storage_offset=inner.storage_offset(), dtype=inner.dtype,
        device=_DEVICE, requires_grad=inner.requires_grad)
    tensor._tpuc_storage, tensor._tpuc_inner = None, inner
    return tensor


def _is_traced(args) -> bool:
    """Whether an op's arguments are traced tensors (`_traced`; in a trace, all of the device's
    are, so the first says)."""
    for value in args:
        if type(value) is TpucTensor:
            return value._tpuc_storage is None
        if type(value) in (list, tuple) and value and type(value[0]) is TpucTensor:
            return value[0]._tpuc_storage is None
    return False


def _mixed_devices(func, tensor: torch.Tensor) -> Exception:
    return _tpuc.TpucError(f"{func}: expected every tensor on the tpuc device, got one on {tensor.device} "
                           "(move it with .to('tpuc'))")


def _traced_op(func, args, kwargs):
    # As on the device's tensors themselves (`_dispatch`), an index op takes CPU indices.
    indices = _schema(func).kind == "indices"

    def inner(value):
        """An argument as the op on the inner tensors takes it: a device tensor as its inner
        tensor; a factory's tensor of the device (a fake one) moved to the meta device like them,
        as are an index op's CPU indices; numbers (0-dimensional tensors) as they are."""
        if isinstance(value, TpucTensor):
            return value._tpuc_meta
        if isinstance(value, torch.Tensor) and value.device.type != "meta":
            if value.device.type == NAME or (indices and value.dim()):
                return value.to("meta")
            if value.dim():
                raise _mixed_devices(func, value)
        return value

    results = func(*tree_map(inner, args), **tree_map(inner, kwargs))
    results = tree_map(lambda v: _traced(v, v.shape, v.stride()) if isinstance(v, torch.Tensor) else v, results)
    return return_and_correct_aliasing(func, args, kwargs, results)


# The storages of the meta tensors standing for the device's tensors in compiled graphs (by
# the address of the meta storage), kept while any such meta tensor lives: aot_autograd hands
# values saved for the backward back as new tensor objects over the same storage, so a meta
# tensor is known by its storage, and holds its device tensor's data as a saved tensor would.
_STANDING: dict = {}
_PURGE_AT = [256]


def _stand_in(tensor: TpucTensor) -> torch.Tensor:
    """A meta tensor standing for `tensor` in compiled graphs (laid out as it is)."""
    inner = _meta_of(tensor)
    storage = tensor._tpuc_storage
    if storage.meta_key not in _STANDING:
        if len(_STANDING) >= _PURGE_AT[0]:
            _purge_standing()
        _STANDING[storage.meta_key] = storage
    return inner


def _purge_standing() -> None:
    """Forgets the storages no meta tensor stands for any more (their own meta tensor alone
    refers to its storage)."""
    uses = torch._C._storage_Use_Count
    for key, storage in list(_STANDING.items()):
        if uses(key) <= storage.meta_uses:
            del _STANDING[key]
    _PURGE_AT[0] = max(256, 2 * len(_STANDING))


def _owner(inner: torch.Tensor) -> TpucTensor:
    """The device tensor a compiled graph's argument or result (`graph_result`) stands for:
    the tensor itself while it lives, else a new one over its storage, laid out as `inner`."""
    owner = inner.__dict__.get("_tpuc_owner")
    tensor = None if owner is None else owner()
    if tensor is not None:
        return tensor
    storage = _STANDING.get(inner.untyped_storage()._cdata) if inner.device.type == "meta" else None
    if storage is None:
        raise _tpuc.TpucError("a compiled graph over the tpuc device's tensors was given a tensor on "
                              f"{inner.device} that stands for none of them")
    return TpucTensor(storage, inner.shape, inner.stride(), inner.storage_offset())


def graph_argument(value, cache):
    """The buffer a compiled graph over the device's tensors runs on for its argument `value`
    (a device tensor's inner tensor; a CPU tensor is put on the device, `cache` keeping it)."""
    if value.device.type == "meta":
        return _materialize(_owner(value))
    if isinstance(value, TpucTensor):
        return _materialize(value)
    return cache.buffer(value)


def graph_result(buffer: _tpuc.DeviceBuffer, dtype: torch.dtype, shape, device_type: str):
    """A compiled graph's result as its traced value was: a device tensor's inner tensor (for
    aot_autograd to unwrap, `__tensor_unflatten__`), a device tensor (a factory's, made without
    device tensors as inputs) or a CPU tensor."""
    if device_type == "cpu":
        return _host(buffer, dtype, shape)
    tensor = _wrap(buffer, shape, dtype)
    return tensor if device_type == NAME else _stand_in(tensor)


class EagerOnDevice(torch.fx.Interpreter):
    """Runs a partitioned graph over the device's tensors (`GraphCompiler.partition`): the nodes
    tpuc compiled no program for run op by op on the device (which runs what it cannot lower on
    the CPU), on the device tensors their values stand for."""

    def call_function(self, target, args, kwargs):
        args, kwargs = tree_map(_standing_for, (args, kwargs))
        results = target(*args, **kwargs)
        return tree_map(lambda v: _stand_in(v) if isinstance(v, TpucTensor) else v, results)


def _standing_for(value):
    """A graph's value as the device's op takes it: a stand-in as its device tensor, the meta
    device (the stand-ins' device, in the graph's factories) as the tpuc device."""
    if isinstance(value, torch.Tensor) and value.device.type == "meta":
        return _owner(value)
    if isinstance(value, torch.device) and value.type == "meta":
        return _DEVICE
    return value


def host_copy(inner: torch.Tensor) -> torch.Tensor:
    """The CPU copy of the device tensor a compiled graph's argument or result stands for."""
    return download(_owner(inner))


def _new(value, dtype: torch.dtype, shape: list, strides: list, numel: int) -> TpucTensor:
    """A new tensor holding `value` (a buffer, or a pending one), its layout given."""
    storage = _Storage.__new__(_Storage)
    storage.buffer, storage.shape, storage.dtype, storage.numel = value, shape, dtype, numel
    storage.meta, storage.meta_key, storage.meta_uses = None, 0, 0
    return TpucTensor(storage, shape, strides, 0, plain=True)


def _wrap(buffer: _tpuc.DeviceBuffer, shape, dtype: torch.dtype) -> TpucTensor:
    shape = list(shape)
    return TpucTensor(_Storage(buffer, shape, dtype), shape, _contiguous_strides(shape), 0, plain=True)


# ---------------------------------------------------------------- host <-> device


def _session():
    return session(None)


def upload(tensor: torch.Tensor) -> TpucTensor:
    """A CPU tensor's value on the device (its own copy: later changes of `tensor` are not seen)."""
    if tensor.layout != torch.strided:
        raise _tpuc.TpucError(f"{tensor.layout} tensors are not supported on the tpuc device (it holds dense "
                              "tensors: .to_dense() first)")
    own = tensor.detach().contiguous().clone()
    buffer = _session().runtime.buffer(own.data_ptr(), own.numel() * own.element_size(),
                                       dtype_name(own.dtype), list(own.shape), own.untyped_storage())
    STATS["uploads"] += 1
    return _wrap(buffer, own.shape, own.dtype)


def download(tensor: TpucTensor) -> torch.Tensor:
    """The tensor's value as a new CPU tensor."""
    return _host(_materialize(tensor), tensor.dtype, tensor.shape)


def _host(buffer: _tpuc.DeviceBuffer, dtype: torch.dtype, shape) -> torch.Tensor:
    """A buffer's elements as a new CPU tensor."""
    out = torch.empty(shape, dtype=dtype)
    buffer.copy_to_host(out.data_ptr(), out.numel() * out.element_size())
    return out


# ---------------------------------------------------------------- ops run on the device


aten = torch.ops.aten


class _OpProgram:
    """A traced graph compiled: the executable, how its arguments are gathered and what each
    output is."""

    __slots__ = ("compiled", "constants", "outputs", "types", "random")

    def __init__(self, compiled, constants, outputs, types):
        self.compiled, self.constants = compiled, constants
        # Whether its random ops take a seed.
        self.random = compiled.random
        # What each output of the graph is, and (dtype, shape) of each compiled output.
        self.outputs, self.types = outputs, types

    def output_buffers(self, results: list, buffers: list) -> list:
        """The buffer of each output of its graph, from its compiled outputs `results` and the
        buffers it ran on (an output that is an input, or a constant, is that buffer)."""
        pool = buffers + self.constants
        return [results[what] if kind == "tensor" else pool[what] for kind, what in self.outputs]


class _OpTrace:
    """One op traced for its arguments' types (`_op_trace`): its graph, whose placeholders are
    the op's tensors in argument order and then the Python floats it takes as inputs
    (`op_tracing.lifted`), what each output of the graph is, and its program once strict mode compiled it."""

    __slots__ = ("func", "gm", "types", "scalar_dtype", "mutated", "outputs", "returns", "lowered", "program")

    def __init__(self, func, gm, types, scalar_dtype, mutated):
        self.func, self.gm, self.types = func, gm, types
        # The dtype of the Python floats it takes as inputs, if it takes any.
        self.scalar_dtype = scalar_dtype
        self.mutated = mutated
        placeholders = {n: i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
        returned = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        # Per output: ("arg", the placeholder it returns) or ("new", dtype, shape).
        self.outputs = []
        for node in returned:
            if node in placeholders:
                self.outputs.append(("arg", placeholders[node]))
            else:
                value = node.meta["val"]
                shape = list(value.shape)
                if all(type(size) is int for size in shape):
                    self.outputs.append(("new", value.dtype, shape, _contiguous_strides(shape), value.numel()))
                else:  # sizes it knows only when it runs: never recorded (`lowered`)
                    self.outputs.append(("new", value.dtype, shape, None, None))
        # Its results where some are no tensors (`_returned`), else None.
        self.returns = gm.meta.get("tpuc_returns")
        from .graph import unsupported_ops
        # Whether it can be compiled: ops tpuc lowers, sizes known before it runs.
        sized = all(type(size) is int for output in self.outputs if output[0] == "new" for size in output[2])
        self.lowered = sized and not unsupported_ops(gm, op_tracing.compiler().supported)
        self.program = None


# Op traces by the op and its arguments' types and values, and (`_LIFTED`) those whose Python
# floats are inputs by the op and its arguments' types: one trace serves every value.
_TRACES: dict = {}
_LIFTED: dict = {}

# What the op programs' cache did: requests, hits, misses by reason, and the time misses cost.
_CACHE = {"requests": 0, "hits": 0, "misses": 0, "loaded_from_disk": 0, "compile_seconds": 0.0,
          "miss_reasons": {"new op": 0, "new argument types": 0, "new argument values": 0,
                           "new recorded run": 0}}
# The argument types each op was compiled for (numbers as their type).
_SEEN: dict = {}


def cache_stats() -> dict:
    """What the cache of programs did in this process (`torch.tpuc.cache_stats()`): requests,
    hits, misses by reason (a new op; an op seen before with other argument dtypes or shapes; the
    same types with other numbers, which are part of its program; in fused mode, a recorded run
    of ops of a new structure), programs loaded from the on-disk cache rather than compiled, and
    the seconds misses took (tracing included)."""
    return {**_CACHE, "miss_reasons": dict(_CACHE["miss_reasons"])}


def _count(miss: str | None) -> None:
    """A request of the program cache: a hit, or a miss for the reason given."""
    _CACHE["requests"] += 1
    if miss is None:
        _CACHE["hits"] += 1
    else:
        _CACHE["misses"] += 1
        _CACHE["miss_reasons"][miss] += 1


def _miss_reason(func, types) -> str:
    """Why `func` on arguments of these types has no program yet."""
    seen = _SEEN.setdefault(func, set())
    reason = "new op" if not seen else "new argument values" if types in seen else "new argument types"
    seen.add(types)
    return reason


def _key_of(value):
    """What of an argument an op's program depends on: a tensor's dtype and shape, any other
    value itself."""
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, tuple(value.shape))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_key_of(v) for v in value))
    if isinstance(value, torch.device):
        return ("device", value.type)
    if type(value) is float:
        return ("float", value.hex())  # -0.0 and 0.0 are two values, a NaN is one
    return (type(value).__name__, value)


class _Schema(op_tracing.Schema):
    """An op's schema with how the device runs it (`kind`): an op handled apart (`special`,
    from `_SPECIAL`), a view, an op changing its argument's sizes and strides in place
    (squeeze_, t_, ...), an op that may take CPU index tensors, or any other op."""

    def __init__(self, func):
        super().__init__(func)
        self.special = _SPECIAL.get(func)
        self.kind = ("special" if self.special is not None else "view" if func.is_view
                     else "inplace_view" if torch.Tag.inplace_view in func.tags
                     else "indices" if func in _TAKES_CPU_INDICES else "op")


def _schema(func) -> _Schema:
    # Kept on the op itself: an attribute is cheaper than hashing the op on every call.
    schema = getattr(func, "_tpuc_schema", None)
    if schema is None:
        schema = func._tpuc_schema = _Schema(func)
    return schema


def _leaves(args, kwargs) -> list:
    """An op's arguments, lists opened, in the order tracing takes its tensors (ATen's argument
    lists hold no nested lists)."""
    out = []
    for value in (*args, *kwargs.values()):
        if type(value) in (list, tuple):
            out.extend(value)
        else:
            out.append(value)
    return out


def _floats_as_types(value):
    return ("float",) if type(value) is float else _key_of(value)


def _op_trace(func, args, kwargs) -> tuple[_OpTrace, list]:
    """`func` on arguments like these, traced (once per key), and the values of the Python
    floats it takes as inputs (the trace serves all their values) if any."""
    # The op's schema stands for it in the key (hashed by identity, unlike the op).
    key = (_schema(func), tuple(_key_of(v) for v in args), tuple((k, _key_of(v)) for k, v in kwargs.items()))
    found = _TRACES.get(key)
    if found is not None:
        return found, []
    types = (func, tuple(_floats_as_types(v) for v in args), tuple((k, _floats_as_types(v)) for k, v in kwargs.items()))
    found = _LIFTED.get(types)
    if found is not None:
        return found, [v for v in _leaves(args, kwargs) if type(v) is float]
    started = time.perf_counter()
    try:
        flat, spec = tree_flatten((args, kwargs))
        mutated = bool(_schema(func).written)
        lifted = op_tracing.lifted(func, flat, spec, _trace)
        if lifted is not None:
            found = _LIFTED[types] = _OpTrace(func, lifted[0], types, lifted[1], mutated)
            return found, [v for v in flat if type(v) is float]
        found = _TRACES[key] = _OpTrace(func, _trace(func, flat, spec), types, None, mutated)
        return found, []
    finally:
        _CACHE["compile_seconds"] += time.perf_counter() - started


def _program(func, args, kwargs) -> tuple[_OpTrace, list]:
    """`func`'s trace for these arguments with its program compiled (once per trace), and the
    Python floats it takes as inputs."""
    trace, floats = _op_trace(func, args, kwargs)
    _compiled(trace)
    return trace, floats


def _compiled(trace: _OpTrace) -> _OpProgram:
    """The trace's program, compiled when first asked for."""
    if trace.program is not None:
        _count(None)
        return trace.program
    _count(_miss_reason(trace.func, trace.types))
    trace.program = _compile(f"eager_{trace.func.__name__.replace('.', '_')}", trace.gm)
    return trace.program


def _trace(func, flat, spec) -> torch.fx.GraphModule:
    """`func` on arguments like `flat` (tensors as placeholders, in order), traced alone."""
    positions = [i for i, v in enumerate(flat) if isinstance(v, torch.Tensor)]
    schema = _schema(func)
    # The flat positions of the written arguments' tensors.
    ids = {id(t) for t in schema.written_tensors(*tree_unflatten(flat, spec))}
    copied = {i for i, v in enumerate(flat) if id(v) in ids}

    def functional(*tensors):
        values = list(flat)
        for i, t in zip(positions, tensors):
            values[i] = t
        # What the op writes, it writes into copies: the program computes their new values.
        values = [v.clone() if i in copied else v for i, v in enumerate(values)]
        call_args, call_kwargs = tree_unflatten(values, spec)
        result = func(*call_args, **call_kwargs)
        # The new values of the written arguments, then what the op returns of its own.
        new = schema.written_tensors(call_args, call_kwargs)
        # What it returns besides the written arguments themselves (batch norm's statistics
        # beside its running ones).
        fresh = [r for r in tree_flatten(result)[0]
                 if not (isinstance(r, torch.Tensor) and any(r is w for w in new))]
        returns[:] = [op_tracing.TENSOR if isinstance(r, torch.Tensor) else r for r in fresh]
        return (*new, *(r for r in fresh if isinstance(r, torch.Tensor)))

    returns: list = []
    examples = [torch.empty(flat[i].shape, dtype=flat[i].dtype) for i in positions]
    from torch.fx.experimental.proxy_tensor import make_fx

    from .compiler import decompositions
    gm = make_fx(functional, decomposition_table=decompositions(op_tracing.compiler().opts), tracing_mode="fake")(*examples)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    # What the op returns, in order: a tensor (the graph's next output) or the value itself.
    gm.meta["tpuc_returns"] = None if all(kind is op_tracing.TENSOR for kind in returns) else returns
    return gm


def _compile(name: str, gm: torch.fx.GraphModule) -> _OpProgram:
    """A traced graph compiled through the backend's compiler and the driver."""
    started = time.perf_counter()
    compiler = op_tracing.compiler()
    prepared = compiler.prepare(gm, name)
    compiled = _session().compile(prepared.program, name, compiler.opts.compile)
    if compiled.cache == "hit":
        _CACHE["loaded_from_disk"] += 1
    constants = [upload(c)._tpuc_storage.buffer for c in prepared.constants]
    types = [(getattr(torch, dtype_text), shape) for dtype_text, shape in compiled.output_specs]
    _CACHE["compile_seconds"] += time.perf_counter() - started
    if compiler.opts.dump_dir:
        _dump(compiler.opts.dump_dir, name, prepared.gm, compiled)
    return _OpProgram(compiled, constants, prepared.outputs, types)


def _dump(directory: str, name: str, gm: torch.fx.GraphModule, compiled) -> None:
    """The dump directory's files of a program the device compiled (as the backend writes them,
    numbered: an op compiles once per argument types), and the device's cache statistics."""
    import json

    from .compiler import dump_graph

    dump_graph(directory, f"{name}_{_CACHE['misses']}", gm, compiled)
    with open(os.path.join(directory, "device_cache_stats.json"), "w") as out:
        json.dump(cache_stats(), out, indent=1)


def _execute(name, program: _OpProgram, buffers: list) -> list:
    """The program run on `buffers` (its graph's inputs, its constants after them): its
    compiled outputs. `name` (an op, or words) names it in errors."""
    arguments = buffers + program.constants if program.constants else buffers
    seed = _session().buffers.seed() if program.random else None
    try:
        return program.compiled.launch(arguments, seed)
    except _tpuc.TpucError as error:
        if not _DEBUG["on"]:
            raise
        raise _tpuc.TpucError(f"{name} failed at {op_tracing.user_line()}: {error}") from error


# Ops tpuc cannot lower, run on the CPU instead (each said once).
_ON_CPU: set = set()


def _downloaded(args, kwargs) -> tuple:
    """An op's arguments with the device's tensors copied to the CPU."""
    return tree_map(lambda v: download(v) if isinstance(v, TpucTensor) else v, (args, kwargs))


def _on_cpu(func, args, kwargs):
    """`func` run by PyTorch on the CPU: the device's tensors copied there, what it writes and
    returns copied back."""
    cpu_args, cpu_kwargs = _downloaded(args, kwargs)
    result = func(*cpu_args, **cpu_kwargs)
    schema = _schema(func)
    targets = schema.written_tensors(args, kwargs)
    for target, value in zip(targets, schema.written_tensors(cpu_args, cpu_kwargs)):
        _write(target, upload(value))
    if targets:
        return targets[0] if len(targets) == 1 else tuple(targets)
    return tree_map(lambda r: upload(r) if isinstance(r, torch.Tensor) else r, result)


def _reads_device_tensors(func, args, kwargs) -> bool:
    """Whether `func` reads a tensor of the device (not only writes one, as a factory's `out=`)."""
    schema = _schema(func)
    written, bound = set(schema.written), schema.bind(args, kwargs)
    return any(isinstance(v, TpucTensor) for name, value in bound.items() if name not in written
               for v in tree_flatten(value)[0])


# Ops whose index tensors may be CPU tensors while the indexed tensor is on the device.
_TAKES_CPU_INDICES = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default,
                      aten._index_put_impl_.default}


def _check_out_shapes(func, args, kwargs) -> None:
    """Refuses an `out=` tensor the op would resize (device tensors keep their shape), by the
    shapes PyTorch's meta kernels give."""
    outs = [name for name in _schema(func).outs if isinstance(kwargs.get(name), TpucTensor)]
    if not outs:
        return
    metas = tree_map(lambda v: _meta_of(v).clone() if isinstance(v, TpucTensor) else v, (args, kwargs))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        func(*metas[0], **metas[1])
    for name in outs:
        given, wanted = list(kwargs[name].shape), list(metas[1][name].shape)
        if given != wanted:
            raise _tpuc.TpucError(
                f"{func}: the out= tensor {name} of the tpuc device has shape {given}, the result "
                f"{wanted}: resizing device tensors is not supported")


def _run(func, args, kwargs):
    """`func` run on the device: its program executed on the arguments' buffers, or recorded in
    fused mode (on the CPU when tpuc cannot lower it)."""
    tensors = []
    for t in _leaves(args, kwargs):
        if isinstance(t, torch.Tensor):
            if not isinstance(t, TpucTensor):
                raise _mixed_devices(func, t)
            tensors.append(t)
    if _schema(func).outs:
        _check_out_shapes(func, args, kwargs)
    if func in _ON_CPU:
        return _on_cpu(func, args, kwargs)
    try:
        if fusion.recording():
            trace, lifted = _op_trace(func, args, kwargs)
            if trace.lowered:
                return _returned(func, args, kwargs, fusion.record(trace, tensors, lifted), trace)
            fusion.flush()
        trace, lifted = _program(func, args, kwargs)
    except Exception as error:  # noqa: BLE001 - only what `_cannot_run` recognises is handled
        reason = op_tracing.cannot_run(error)
        if reason is None:
            raise
        if _reads_device_tensors(func, args, kwargs):
            op_tracing.falls_back(func, reason, error)
        _ON_CPU.add(func)
        return _on_cpu(func, args, kwargs)
    program = trace.program
    buffers = [_materialize(t) for t in tensors] + [_scalar_buffer(v, trace.scalar_dtype) for v in lifted]
    results = _execute(func, program, buffers)
    values = []
    for kind, what in program.outputs:
        if kind == "tensor":
            dtype, shape = program.types[what]
            values.append(_wrap(results[what], shape, dtype))
        elif kind == "arg":
            values.append(tensors[what])
        else:
            values.append(what)
    if _DEBUG["on"]:
        _check(func, args, kwargs, values, trace.mutated)
    return _returned(func, args, kwargs, values, trace)


def _returned(func, args, kwargs, values: list, trace: _OpTrace):
    """What `func` returns, given its traced graph's outputs `values` (the new values of what it
    writes, which are written, when it writes)."""
    schema = _schema(func)
    if trace.mutated:
        written = schema.written_tensors(args, kwargs)
        for target, value in zip(written, values):
            _write(target, value)
        values = values[len(written):]
        if not values and trace.returns is None:
            # It returns what it writes (add_, out=).
            return written[0] if len(written) == 1 else tuple(written)
    if trace.returns is not None:
        # Results that are no tensors (None, numbers) where it returns them.
        given = iter(values)
        values = [next(given) if kind is op_tracing.TENSOR else kind for kind in trace.returns]
    if schema.returns_one:
        return values[0] if values else None
    return values if schema.returns_list else tuple(values)


def _run_trace(trace: _OpTrace, buffers: list) -> list:
    """A recorded op run alone on `buffers` (fused mode, when its run does not compile): the
    buffers of its new outputs. On the CPU, with a warning, when tpuc cannot lower it."""
    func = trace.func
    if func not in _ON_CPU:
        try:
            program = _compiled(trace)
        except _tpuc.TpucError as error:
            reason = op_tracing.cannot_run(error)
            if reason is None:
                raise
            op_tracing.falls_back(func, reason, error)
            _ON_CPU.add(func)
        else:
            returned = program.output_buffers(_execute(func, program, buffers), buffers)
            return [b for b, output in zip(returned, trace.outputs) if output[0] == "new"]
    placeholders = [n for n in trace.gm.graph.nodes if n.op == "placeholder"]
    cpu = [_host(b, n.meta["val"].dtype, n.meta["val"].shape) for b, n in zip(buffers, placeholders)]
    results = trace.gm(*cpu)
    return [upload(r)._tpuc_storage.buffer for r, output in zip(results, trace.outputs) if output[0] == "new"]


# Debug mode (`debug`): what each op's results are checked for.
_DEBUG = {"on": False, "finite": False, "compare": False, "rtol": 1e-4, "atol": 1e-5}


def debug(on: bool = True, *, finite: bool = False, compare: bool = False, rtol: float = 1e-4,
          atol: float = 1e-5) -> None:
    """Debug mode: every op's results are read back when it runs, so that an error names the op
    and the line of the user's code that ran it; `finite` stops at the first op that makes a NaN
    or an infinity from finite inputs; `compare` runs every op on the CPU too and stops at the
    first whose result differs beyond `rtol`/`atol`, saying by how much. `debug(False)` returns
    to strict mode; turning it on leaves fused mode."""
    if on:
        fusion.enable(False)
    _DEBUG.update(on=on, finite=finite, compare=compare, rtol=rtol, atol=atol)


def fused(on: bool = True, *, max_ops: int = 1000) -> None:
    """Fused mode: ops are recorded, not run, until a value is needed (`.cpu()`, `.item()`,
    printing, a branch on a value, `torch.tpuc.synchronize()`), after each optimizer step, and
    every `max_ops` ops; each recorded run is compiled as one program, cached by its structure.
    `fused(False)` runs what was recorded and returns to strict mode; turning it on leaves debug
    mode."""
    if on:
        _DEBUG["on"] = False
    fusion.enable(on, max_ops=max_ops)


def _check(func, args, kwargs, values, mutated: bool) -> None:
    """Debug mode's checks of `func`'s results `values` (the new values of what it writes when
    `mutated`)."""
    results = [download(v) for v in values if isinstance(v, TpucTensor)]
    cpu_args, cpu_kwargs = _downloaded(args, kwargs)
    op_tracing.check_results(func, cpu_args, cpu_kwargs, results, mutated, finite=_DEBUG["finite"],
                             compare=_DEBUG["compare"], rtol=_DEBUG["rtol"], atol=_DEBUG["atol"])


# Lifted floats on the device, by value and dtype: the same ones recur (an epsilon, a decay).
_SCALARS: dict = {}


def _scalar_buffer(value: float, dtype: torch.dtype) -> _tpuc.DeviceBuffer:
    """A lifted float (`op_tracing.lifted`) on the device, as a program's 0-dimensional input."""
    key = (value.hex(), dtype)  # -0.0 is not 0.0 here
    found = _SCALARS.get(key)
    if found is None:
        if len(_SCALARS) >= 256:
            _SCALARS.clear()
        host = torch.tensor(value, dtype=dtype)
        found = _SCALARS[key] = _session().runtime.buffer(
            host.data_ptr(), host.element_size(), dtype_name(host.dtype), [], host.untyped_storage())
    return found


def _value(tensor: TpucTensor):
    """The tensor's elements as a value of its shape: its storage's own, or read through the
    view (the view ops that made it replayed on their source's value, else an as_strided op over
    the storage); in fused mode, perhaps a value recorded ops will compute (`fusion.Pending`)."""
    storage = tensor._tpuc_storage
    if tensor._tpuc_plain:
        return storage.value()
    recipe = tensor._tpuc_view
    if recipe is not None:
        func, args, kwargs, index = recipe
        result = _run(func, args, kwargs)
        return (result if index is None else result[index])._tpuc_storage.value()
    base = _wrap(storage.value(), storage.shape, storage.dtype)
    if (tensor.storage_offset() == 0 and tensor.numel() == storage.numel
            and list(tensor.stride()) == _contiguous_strides(tensor.shape)):
        # The storage's elements in another shape.
        return _run(aten.view.default, (base, list(tensor.shape)), {})._tpuc_storage.value()
    view = _run(aten.as_strided.default, (base, list(tensor.shape), list(tensor.stride()), tensor.storage_offset()), {})
    return view._tpuc_storage.value()


def _materialize(tensor: TpucTensor) -> _tpuc.DeviceBuffer:
    """The tensor's elements as a buffer of its shape (in fused mode, the recorded ops that
    compute it run first)."""
    value = _value(tensor)
    return fusion.resolve(value) if type(value) is fusion.Pending else value


def _write(target: TpucTensor, value: TpucTensor) -> None:
    """Writes `value` (a plain tensor of `target`'s shape) into `target`'s elements, for every
    view of its storage to see."""
    storage = target._tpuc_storage
    if list(value.shape) != list(target.shape) and value.dim() and torch.Size(
            torch.broadcast_shapes(value.shape, target.shape)) != target.shape:
        raise _tpuc.TpucError(
            f"a tensor of the tpuc device of shape {list(target.shape)} cannot take a value of shape "
            f"{list(value.shape)}: resizing device tensors (an out= of another size, resize_) is not "
            "supported")
    if value.dtype != target.dtype or list(value.shape) != list(target.shape):
        value = _run(aten._to_copy.default, (value.expand(target.shape),), {"dtype": target.dtype})
    if target.plain():
        storage.buffer = _value(value)
        return
    base = _wrap(storage.value(), storage.shape, storage.dtype)
    new = _run(aten.as_strided_scatter.default,
               (base, value, list(target.shape), list(target.stride()), target.storage_offset()), {})
    storage.buffer = new._tpuc_storage.value()


def _meta_of(tensor: TpucTensor) -> torch.Tensor:
    """A meta tensor laid out as `tensor` over its storage's meta tensor."""
    storage = tensor._tpuc_storage
    if storage.meta is None:
        storage.meta = torch.empty(storage.numel, dtype=storage.dtype, device="meta")
        storage.meta_key = storage.meta.untyped_storage()._cdata
        storage.meta_uses = torch._C._storage_Use_Count(storage.meta_key)
    return storage.meta.as_strided(tensor.shape, tensor.stride(), tensor.storage_offset())


# The layouts view ops give, by the op and its arguments' layouts and values: each is
# computed once by PyTorch's meta kernels.
_VIEW_LAYOUTS: dict = {}


def _layout_key(value):
    if isinstance(value, TpucTensor):
        return ("tensor", value.dtype, tuple(value.shape), value.stride(), value.storage_offset(),
                value._tpuc_storage.numel)
    if type(value) in (list, tuple):
        return tuple(_layout_key(v) for v in value)
    return _key_of(value)


def _view_layouts(func, args, kwargs, storage: _Storage):
    """(size, stride, offset) of the view `func` makes, or a list of them (a list of views),
    from PyTorch's meta kernels."""
    def meta(value):
        if isinstance(value, TpucTensor):
            return _meta_of(value)
        if type(value) in (list, tuple):
            return type(value)(meta(v) for v in value)
        return value

    result = func(*[meta(a) for a in args], **{k: meta(v) for k, v in kwargs.items()})

    def layout(view):
        if view.dtype != storage.dtype:
            raise _tpuc.TpucError(f"{func}: a view in another dtype ({view.dtype}) is not supported on the tpuc device")
        return (tuple(view.shape), view.stride(), view.storage_offset())

    return layout(result) if isinstance(result, torch.Tensor) else [layout(v) for v in result]


def _view(func, args, kwargs):
    """A view op: the same storage, the sizes, strides and offset PyTorch's meta kernels give;
    each view remembers the op, to be read by replaying it."""
    source = next(a for a in _leaves(args, kwargs) if isinstance(a, TpucTensor))
    storage = source._tpuc_storage
    key = (func, tuple(_layout_key(a) for a in args), tuple((k, _layout_key(v)) for k, v in kwargs.items()))
    layouts = _VIEW_LAYOUTS.get(key)
    if layouts is None:
        layouts = _VIEW_LAYOUTS[key] = _view_layouts(func, args, kwargs, storage)
    depth = source._tpuc_depth + 1
    # as_strided addresses the storage, not its source's elements: it is not replayed on them.
    replayable = depth <= _VIEW_CHAIN and func is not aten.as_strided.default

    def view(layout, index):
        recipe = (func, args, kwargs, index) if replayable else None
        return TpucTensor(storage, *layout, view=recipe, depth=depth if replayable else 0)

    if type(layouts) is tuple:
        return view(layouts, None)
    return [view(layout, i) for i, layout in enumerate(layouts)]


# ---------------------------------------------------------------- ops handled apart


def _to_copy(args, kwargs):
    (source,) = args
    device = kwargs.get("device")
    dtype = kwargs.get("dtype") or source.dtype
    if device is not None and torch.device(device).type == "cpu":
        return download(source).to(dtype)
    return _run(aten._to_copy.default, (source,), {"dtype": dtype})


def _copy(args, kwargs):
    target, source = args[0], args[1]
    if not isinstance(target, TpucTensor):
        return target.copy_(download(source))
    if not isinstance(source, TpucTensor):
        source = upload(source.to(target.dtype).expand(target.shape))
    _write(target, source)
    return target


def _local_scalar_dense(args, kwargs):
    return download(args[0]).item()


def _conj(args, kwargs):
    # A conjugate view is a flag on the tensor in PyTorch; here its values, computed.
    return _run(aten.conj_physical.default, args, {})


def _neg_view(args, kwargs):
    return _run(aten.neg.default, args, {})


_SPECIAL = {
    aten._conj.default: _conj,
    aten._neg_view.default: _neg_view,
    aten._to_copy.default: _to_copy,
    aten.copy_.default: _copy,
    aten._local_scalar_dense.default: _local_scalar_dense,
}


def _scalars(value):
    """A 0-dimensional CPU tensor (a Python number the dispatcher wrapped, or a scalar tensor
    PyTorch lets mix with any device's) as the number it holds."""
    if isinstance(value, torch.Tensor) and not isinstance(value, TpucTensor) and value.dim() == 0 \
            and value.device.type == "cpu":
        return value.item()
    return value


def _from_cpu(value):
    """A CPU tensor an index op takes with the device's tensors, on the device."""
    return upload(value) if isinstance(value, torch.Tensor) and not isinstance(value, TpucTensor) else value


def _dispatch(func, args, kwargs):
    schema = _schema(func)
    kind = schema.kind
    if kind == "special":
        return schema.special(args, kwargs)
    # The CPU tensors an op takes with the device's as on other devices: an index op's indices,
    # and 0-dimensional tensors (numbers).
    if kind == "indices":
        args = tuple(tree_map(_from_cpu, list(args)))
    elif any(type(a) is torch.Tensor for a in args):
        args, kwargs = tree_map(_scalars, (args, kwargs))
    if kind == "view":
        return _view(func, args, kwargs)
    if kind == "inplace_view":
        return _inplace_view(func, args, kwargs)
    return _run(func, args, kwargs)


def _inplace_view(func, args, kwargs):
    """An op changing its tensor's sizes and strides in place (squeeze_, t_, as_strided_): the
    wrapper's own layout changed by PyTorch's meta kernel, over the same storage."""
    target = args[0]
    if func in (aten.resize_.default, aten.resize_as_.default):
        size = list(args[1]) if func is aten.resize_.default else list(args[1].shape)
        if size == list(target.shape):
            return target
        raise _tpuc.TpucError(f"{func}: resizing a tensor of the tpuc device ({list(target.shape)} to {size}) is "
                              "not supported; make a new tensor of the size instead")
    with torch.utils._mode_utils.no_dispatch():
        meta_in_tls = torch._C._meta_in_tls_dispatch_include()
        torch._C._set_meta_in_tls_dispatch_include(True)
        try:
            func(*args, **kwargs)
        finally:
            torch._C._set_meta_in_tls_dispatch_include(meta_in_tls)
    storage = target._tpuc_storage
    target._tpuc_plain = _is_plain(storage, target.shape, target.stride(), target.storage_offset())
    # Its new layout is read over the storage (sizes and strides), not by replaying views.
    target._tpuc_view, target._tpuc_depth, target._tpuc_inner = None, 0, None
    return target


# ---------------------------------------------------------------- factories


def _empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return upload(torch.zeros(size, dtype=dtype or torch.get_default_dtype()))


def _empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    return _empty(size, dtype)


def _factory_on_cpu(op, *args, **kwargs):
    """A factory op for the tpuc device (arange, full, rand...): computed on the CPU, uploaded."""
    kwargs = {k: (torch.device("cpu") if k == "device" else v) for k, v in kwargs.items()}
    result = op(*args, **kwargs)
    return tree_map(lambda r: upload(r) if isinstance(r, torch.Tensor) else r, result)


_LIBRARIES: list = []


# Factories PyTorch composes from `empty` and an `out=` op that resizes it: made on the CPU
# (random ones from torch's generator, as on the CPU) and uploaded.
_CPU_FACTORIES = ("arange", "arange.start", "arange.start_step", "linspace", "logspace", "eye", "eye.m",
                  "randperm", "rand", "randn", "randint", "randint.low", "full", "scalar_tensor", "tril_indices",
                  "triu_indices")


def _copy_from(source, target, non_blocking=False):
    """copy_ across devices where PyTorch calls it below the Python key (`torch.tensor(data,
    device="tpuc")`)."""
    return _copy((target, source), {})


def _register_kernels() -> None:
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("_copy_from", _copy_from, "PrivateUse1")
    lib.impl("empty.memory_format", _empty, "PrivateUse1")
    lib.impl("empty_strided", _empty_strided, "PrivateUse1")
    for name in _CPU_FACTORIES:
        op = getattr(aten, name.split(".")[0])
        overload = getattr(op, name.split(".")[1] if "." in name else "default")
        lib.impl(name, functools.partial(_factory_on_cpu, overload), "PrivateUse1")
    fallback = torch.library.Library("_", "IMPL")
    fallback.fallback(_factory_on_cpu, "PrivateUse1")
    _LIBRARIES.extend([lib, fallback])


@functools.cache
def hide_from_dynamo() -> None:
    """Keeps Dynamo out of the device's own Python (done when the compile backend is imported).
    Dynamo does not trace the device's tensors (a wrapper subclass with no tensor inside), so it
    runs code on them eagerly, op by op on the device; without this it would also try to trace
    the device's dispatch, warning about every builtin it meets there."""
    from torch._dynamo import trace_rules

    # Skipped files (not wrappers around functions, which would cost every op a frame check).
    for module in (__name__, fusion.__name__):
        trace_rules.add(module)


@functools.cache
def enable() -> None:
    """Makes `torch.device("tpuc")` available (done when tpuc is imported)."""
    fusion.attach_device(fusion.DeviceFunctions(
        value=_value, scalar_buffer=_scalar_buffer, new=_new, compile=_compile, execute=_execute,
        run_trace=_run_trace, cannot_run=op_tracing.cannot_run, count=_count))
    attach_device(DeviceHooks(session=_session, argument=graph_argument, result=graph_result,
                              eager=lambda module: EagerOnDevice(module).run, hide_from_dynamo=hide_from_dynamo))
    accelerator.claim_device(_register_device)
