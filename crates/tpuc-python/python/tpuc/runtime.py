"""Running compiled graphs on torch tensors: device buffers for inputs (cached while a tensor is
unchanged, aliasing its memory where the plugin allows), outputs copied into new tensors."""
from __future__ import annotations

import os
import sys
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass
from torch.utils.dlpack import from_dlpack

from . import _tpuc

# Counts of compilations (graphs not compiled before in this process), those of them loaded from
# the cache of compiled executables instead, host-to-device uploads, reused device buffers and
# computations of weight-derived values, for tests and diagnostics.
# Compilations served by an executable compiled for the same bucket of sizes count as bucket hits.
# Inputs a graph updated in place, in their own memory, count as in_place; compilations done
# ahead, in the background, before the graph was asked for, as compiled_ahead.
STATS = {"compiles": 0, "cache_hits": 0, "uploads": 0, "reused": 0, "prepared": 0, "bucket_hits": 0,
         "in_place": 0, "compiled_ahead": 0}

class DeviceHooks(NamedTuple):
    """What the layers below the eager device need of it, given by the device when it is
    enabled (`attach_device`): they never import it.

    session:          the device's `Session`.
    argument:         `argument(value, cache, device)`, the buffer a compiled graph over the
                      device's tensors runs on, on device number `device`, for its argument `value`.
    result:           `result(buffer, dtype, shape, where, device)`, a compiled graph's result as
                      its traced value was (a tensor of device number `device`, or of the CPU).
    device_of:        `device_of(values)`, the number of the device a compiled graph with these
                      arguments runs on.
    eager:            `eager(module)`, a function running a partitioned graph over the device's
                      tensors with its uncompiled nodes op by op on the device.
    hide_from_dynamo: keeps Dynamo out of the device's own code.
    """

    session: Callable[[], "Session"]
    argument: Callable
    result: Callable
    device_of: Callable[[list], int]
    eager: Callable
    hide_from_dynamo: Callable[[], None]


_DEVICE: DeviceHooks | None = None


def attach_device(hooks: DeviceHooks) -> None:
    global _DEVICE
    _DEVICE = hooks


def device_hooks() -> DeviceHooks:
    """The eager device's hooks (importing the package enables the device, which gives them)."""
    if _DEVICE is None:
        raise _tpuc.TpucError("the tpuc device is not enabled (import tpuc enables it)")
    return _DEVICE


_RUNTIMES: dict[tuple, "Session"] = {}
_RUNTIMES_LOCK = threading.Lock()

# The torch dtypes tpuc handles, by the names tpuc's dtype model gives them.
DTYPES = {name: getattr(torch, name) for name in _tpuc.dtype_names()}


class Session:
    """One plugin's client and the device buffers of input tensors, shared by every graph
    compiled for that plugin in this process. The compiled executables and the values derived
    from weights are the driver's: it keeps them per client."""

    def __init__(self, plugin: str, mesh: _tpuc.Mesh | None = None):
        # The interpreter's own sys.path says where its packages (the plugins among them) are.
        paths = [p for p in sys.path if p]
        if mesh is None:
            # The eager device's devices (`tpuc:0`, `tpuc:1`, ...), each running its own programs.
            self.runtime = _tpuc.Runtime.each(plugin, paths, eager_devices(plugin))
        else:
            self.runtime = _tpuc.Runtime(plugin, paths, mesh)
        self.mesh = mesh
        self.buffers = BufferCache(self.runtime)
        # The CPU plugin's device memory is host memory: outputs become tensors without a copy.
        self.host_memory = self.runtime.platform == "cpu"
        # A cache that cannot store is said once per session.
        self.cache_warned = False

    def compile(self, program: bytes, name: str, options: _tpuc.CompileOptions, **graph) -> _tpuc.CompiledGraph | None:
        """The executable of `program` (its serialized form holds the ops, the input and output
        types, and the source locations), compiled with `options` once per distinct graph and
        options in this process. `graph` says what is particular to this graph, as
        `_tpuc.Runtime.compile` takes it: `stable` flags the inputs that stay the same between
        calls; `specs` lays each input out over the session's mesh, `result_specs` each output
        (whole where None, or laid out by XLA's partitioner with `open_results`: `result_specs` of
        what comes back); `process_groups` makes it one rank's program run on every device;
        `input_dims` fixes the sizes of a program with symbolic ones, compiled for the options'
        buckets when `bucketed`; `donate` pairs inputs the graph updates in place with their new
        values; `background` compiles it on the runtime's threads and returns None (a later
        `compile` of it finds it done or waits for it)."""
        compiled = self.runtime.compile(program, name, options, **graph)
        if compiled is None:  # compiling in the background (`background=True`)
            return None
        if compiled.reused:
            if compiled.bucket is not None:
                STATS["bucket_hits"] += 1
            return compiled
        STATS["compiles"] += 1
        if compiled.ahead:
            STATS["compiled_ahead"] += 1
        if compiled.cache == "hit":
            STATS["cache_hits"] += 1
        elif compiled.cache.startswith("not stored") and not self.cache_warned:
            self.cache_warned = True
            warnings.warn(f"tpuc: compiled executables are not cached ({compiled.cache}); the "
                          "option cache_dir or TPUC_CACHE_DIR chooses another directory, 'off' none",
                          stacklevel=2)
        return compiled


def eager_devices(plugin: str = "cpu") -> int | None:
    """How many devices the eager device has, as TPUC_DEVICES says (None: every device of the
    plugin). The CPU plugin has as many as it is asked for: one, or under torchrun as many as
    the node has ranks (LOCAL_WORLD_SIZE), so that each rank's `set_device(local_rank)` finds
    its device, as each CUDA process sees every GPU of its node."""
    text = os.environ.get("TPUC_DEVICES")
    if text is None or text == "":
        local = os.environ.get("LOCAL_WORLD_SIZE", "")
        if plugin == "cpu" and local.isdigit() and int(local) > 1:
            return int(local)
        return None
    try:
        count = int(text)
    except ValueError:
        count = 0
    if count < 1:
        raise _tpuc.TpucError(f"TPUC_DEVICES={text!r}: the number of devices of the tpuc device, 1 or more")
    return count


def session(plugin: str | None, mesh: _tpuc.Mesh | None = None) -> Session:
    """The process's session of `plugin` over one device or `mesh` (one per plugin and mesh)."""
    name = plugin or os.environ.get("TPUC_PJRT_PLUGIN") or "cpu"
    key = (name, mesh)
    with _RUNTIMES_LOCK:
        found = _RUNTIMES.get(key)
        if found is None:
            found = _RUNTIMES[key] = Session(name, mesh)
        return found


def dtype_name(dtype: torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise _tpuc.TpucError(f"tpuc does not handle tensors of dtype {dtype}")
    return name




class BufferCache:
    """Device buffers of input tensors. A tensor keeps its buffer while its storage, version,
    shape and dtype stay the same (parameters between optimizer steps, say); the entry goes
    when the tensor does."""

    def __init__(self, rt: _tpuc.Runtime):
        self.runtime = rt
        self.entries: dict[int, tuple] = {}
        self.lock = threading.Lock()

    def _forget(self, tensor_id: int, ref) -> None:
        with self.lock:
            entry = self.entries.get(tensor_id)
            if entry is not None and entry[0] is ref:
                del self.entries[tensor_id]

    def buffer(self, tensor: torch.Tensor, spec=None, device: int | None = None) -> _tpuc.DeviceBuffer:
        """The tensor on the devices, each holding its part as `spec` lays it out (a tuple of
        tuples of axes; whole when None), or whole on device number `device` of the eager
        device's devices."""
        # Hot path (every argument of every call): a dict read, atomic under the GIL.
        entry = self.entries.get(id(tensor))
        if entry is not None and entry[0]() is tensor and entry[4] == spec and entry[5] == device:
            try:
                unchanged = entry[1] == tensor._version and entry[2] == tensor.data_ptr()
            except RuntimeError:  # inference-mode tensors have no version counter
                unchanged = False
            if unchanged:
                STATS["reused"] += 1
                return entry[3]
        return self._upload(tensor, spec, device)

    def donatable(self, tensor: torch.Tensor) -> "_tpuc.DonatedBuffer":
        """`tensor`'s memory for a graph that updates it in place (never cached: the graph
        takes it over). On the CPU plugin the graph writes the new value into the tensor."""
        STATS["uploads"] += 1
        return self.runtime.donatable_buffer(*_memory(tensor), tensor.untyped_storage())

    def seed(self, device: int | None = None) -> _tpuc.DeviceBuffer:
        """A fresh seed for a graph's random ops (on device number `device` of the eager
        device's), drawn from torch's default generator, so that torch.manual_seed makes
        compiled random ops repeatable (docs/random.md)."""
        seed = torch.randint(-(2**63), 2**63 - 1, (2,), dtype=torch.int64)
        return self.runtime.buffer(seed.data_ptr(), 16, "uint64", [2], seed.untyped_storage(), None, device)

    def host_input(self, tensor: torch.Tensor) -> "_tpuc.HostInput":
        """`tensor`'s memory for one call, which uploads it (padded to the bucket's shape where
        the graph takes it larger); never cached."""
        source = _plain(tensor)
        STATS["uploads"] += 1
        return _tpuc.HostInput(*_memory(source), source.untyped_storage())

    def _upload(self, tensor: torch.Tensor, spec=None, device: int | None = None) -> _tpuc.DeviceBuffer:
        try:
            version = tensor._version
        except RuntimeError:  # inference-mode tensors: never cached
            version = None
        source = _plain(tensor)
        STATS["uploads"] += 1
        # The storage keeps the memory alive, not the tensor.
        buffer = self.runtime.buffer(*_memory(source), source.untyped_storage(), _axes(spec), device)
        # A tensor's version changes with every in-place update, including resizes; its data
        # pointer with set_(). Either makes the cached buffer stale.
        if version is not None and source.data_ptr() == tensor.data_ptr():
            tensor_id = id(tensor)
            ref = weakref.ref(tensor, lambda r, i=tensor_id: self._forget(i, r))
            with self.lock:
                self.entries[tensor_id] = (ref, version, tensor.data_ptr(), buffer, spec, device)
        return buffer


def _memory(tensor: torch.Tensor) -> tuple:
    """A contiguous CPU tensor's memory as the runtime takes it: address, bytes, dtype, shape."""
    return tensor.data_ptr(), tensor.numel() * tensor.element_size(), dtype_name(tensor.dtype), list(tensor.shape)


def _axes(spec) -> list | None:
    """A partition spec (a tuple of tuples of axes, None when whole) as the runtime takes it."""
    return None if spec is None else [list(axes) for axes in spec]


def _plain(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor`'s data as a contiguous CPU tensor without autograd history (itself where it is
    one), or an error saying why tpuc cannot take it."""
    if tensor.device.type != "cpu":
        raise _tpuc.TpucError(
            f"tpuc takes CPU tensors (the plugin places them on its device); got one on {tensor.device}"
        )
    if is_traceable_wrapper_subclass(tensor):
        raise _tpuc.TpucError(
            f"tpuc takes plain tensors; got a {type(tensor).__name__}, which holds no data of its own "
            "(pass its local tensor: to_local() for a DTensor)"
        )
    source = tensor if tensor.is_contiguous() else tensor.contiguous()
    return source.detach() if source.requires_grad else source


def _spec_key(spec):
    """A partition spec as a hashable value: a tuple of tuples of axes, or None when whole."""
    if spec is None or all(not axes for axes in spec):
        return None
    return tuple(tuple(axes) for axes in spec)


class CompiledGraph:
    """A compiled graph as a function of the graph's original inputs and outputs.

    inputs:   positions of the original arguments (then the constants) the compiled graph takes.
    outputs:  the original output structure: ("tensor", i) for the compiled graph's i-th output,
              ("arg", i) for the graph's i-th argument returned as it is (an opaque object),
              ("value", v) for a constant (None, an int) returned as it is, ("wrapped", (i, f))
              for f of compiled output i (a quantized tensor made of its values), ("host", f) for a
              size computed on the host from the arguments, f(args).
    single:   the original graph returned one value rather than a tuple.
    devices:  for a graph over the tpuc device's tensors, the device type of each compiled
              output as traced ("tpuc", "cpu"); its calls run on the device tensors' values
              (`call_on_device`). None for a graph of CPU tensors.
    checks:   functions of the call's arguments and compiled outputs that raise torch's error
              where the program's checks fail (an LU's info for a singular matrix, an
              assertion); they run after the call.
    """

    def __init__(self, compiled: _tpuc.CompiledGraph, session: "Session", inputs: list[int],
                 outputs: list[tuple], single: bool, constants: list | None = None,
                 devices: list[str] | None = None, checks: list | None = None):
        self.compiled = compiled
        self.checks = list(checks or [])
        self.devices = devices
        self.cache = session.buffers
        self.inputs = inputs
        self.outputs = outputs
        self.single = single
        # Constant tensors of the graph, passed after its own arguments.
        self.constants = list(constants or [])
        self.specs = [(DTYPES[d], tuple(s)) for d, s in compiled.output_specs]
        self.random = compiled.random
        # How each input is laid out over the session's mesh (all None on one device).
        self.input_specs = [_spec_key(spec) for spec in compiled.input_specs]
        # Outputs split over the devices are assembled from their parts (`copy_to`), not aliased.
        self.zero_copy = (session.host_memory and all(0 not in shape for _, shape in self.specs)
                          and compiled.outputs_whole)
        # Compiled for buckets: inputs with a padded dimension are given as host memory, which
        # the call pads to the bucket's shape; outputs come back at their true shapes.
        self.bucket = compiled.bucket
        self.padded = frozenset(compiled.padded_inputs) if self.bucket is not None else frozenset()
        self.padded_shapes = compiled.input_shapes
        # Inputs the graph updates in place (only on one device whose memory is the host's):
        # (input, output). `call` gives up those that are contiguous; the others are passed as
        # usual and updated by aot_autograd's copy.
        self.donated = [(k, r) for k, r in compiled.donations if k not in self.padded]
        # The common case, called on its own short path: the graph's inputs are its arguments as
        # they are, on one device, and its outputs come back aliased, in order. (Values derived
        # from the stable inputs are the runtime's: computed once per set of their buffers, and a
        # call says when it computed them.)
        self.direct = (devices is None and not self.constants and self.bucket is None and not self.donated
                       and self.zero_copy and not self.random
                       and all(spec is None for spec in self.input_specs)
                       and self.outputs == [("tensor", i) for i in range(len(self.specs))])

    def __call__(self, *args):
        return self.call(list(args))

    def call(self, args: list):
        if self.direct:
            buffer = self.cache.buffer
            capsules, prepared_now = self.compiled.run_dlpack([buffer(args[i]) for i in self.inputs])
            if prepared_now:
                STATS["prepared"] += 1
            results = [from_dlpack(c) for c in capsules]
            return results[0] if self.single else results
        if self.devices is not None:
            return self.call_on_device(args)
        if self.constants:
            args = list(args) + self.constants
        given = [args[i] for i in self.inputs]
        arguments = []
        for k, (tensor, spec) in enumerate(zip(given, self.input_specs)):
            if k in self.padded and list(tensor.shape) != self.padded_shapes[k]:
                arguments.append(self.cache.host_input(tensor))
            else:
                arguments.append(self.cache.buffer(tensor, spec))
        # Inputs updated in place give their memory up to their new value (never cached).
        donated = [(k, r) for k, r in self.donated if given[k].is_contiguous()]
        for k, _ in donated:
            arguments[k] = self.cache.donatable(given[k])
        run = self.compiled.execute(arguments, self.cache.seed() if self.random else None)
        if run.prepared_now:
            STATS["prepared"] += 1
        if donated:
            results = [from_dlpack(c) for c in run.dlpack()]
            for k, r in donated:
                if results[r].data_ptr() == given[k].data_ptr():
                    # The input holds its new value: aot_autograd's copy into it is a no-op.
                    results[r] = given[k]
                    STATS["in_place"] += 1
        elif self.zero_copy:
            results = [from_dlpack(c) for c in run.dlpack()]
        else:
            results = [torch.empty(shape, dtype=dtype) for (dtype, _), shape in zip(self.specs, run.shapes)]
            run.copy_to([(r.data_ptr(), r.numel() * r.element_size()) for r in results])
        return self.returned(args, results)

    def call_on_device(self, args: list):
        """A call of a graph over the tpuc device's tensors: their buffers in, its results' buffers
        out as the device's tensors, nothing copied (`device.graph_argument`, `graph_result`)."""
        hooks = device_hooks()
        given = list(args) + self.constants
        device = hooks.device_of([given[i] for i in self.inputs])
        arguments = [hooks.argument(given[i], self.cache, device) for i in self.inputs]
        buffers = self.compiled.launch(arguments, self.cache.seed(device) if self.random else None, device)
        results = [hooks.result(buffer, dtype, shape, where, device)
                   for buffer, (dtype, shape), where in zip(buffers, self.specs, self.devices)]
        return self.returned(args, results)

    def returned(self, args: list, results: list):
        """The original graph's outputs, from the call's arguments and the compiled outputs."""
        for check in self.checks:
            check(args, results)
        values = [results[x] if kind == "tensor" else args[x] if kind == "arg" else x(args) if kind == "host"
                  else x[1](results[x[0]]) if kind == "wrapped" else x
                  for kind, x in self.outputs]
        return values[0] if self.single else values
