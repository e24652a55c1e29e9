"""`torch.tpuc`, this module (registered as the device's module): what PyTorch's accelerator
API, its utilities and libraries ask of a device's module, as `torch.cuda` offers it: the devices
and the current one, streams and events, random states, the device's name and properties.

The tpuc device runs its ops in order, on one queue per device (the runtime's executions,
asynchronous): a stream is that queue, so every stream of a device is its default stream and
waits between streams hold already; an event is a point in it, recorded once the work before it
is done (its time is the host's clock then, which is what `elapsed_time` compares). Each device
has its own random state, a seed and an offset as a CUDA device's Philox generator has them
(docs/random.md).
"""
from __future__ import annotations

import os
import struct
import threading
import time
import warnings
from typing import Callable, NamedTuple

import torch

from . import _tpuc_native
from .runtime import session

NAME = "tpuc"
_CLAIM_LOCK = threading.Lock()


def claim_device(register: Callable[[], None]) -> None:
    """Makes PyTorch's PrivateUse1 device the `tpuc` device, once per process: `register` names it
    and gives it its kernels, guard, hooks and this module. Leaves it to another backend that took
    it first (TorchTPU's `tpu`), with a warning."""
    with _CLAIM_LOCK:
        taken = torch._C._get_privateuse1_backend_name()
        if taken == NAME:
            return
        if taken != "privateuseone":
            warnings.warn(f"tpuc: PyTorch's PrivateUse1 device is {taken!r}, another backend's: the tpuc device "
                          "is not available in this process (torch.compile(backend='tpuc') is)", stacklevel=3)
            return
        register()


def _session():
    return session(None)


def identify_in_dlpack() -> None:
    """Device tensors say which device they are on to DLPack consumers (`torch.from_dlpack(t)`)
    as PyTorch means PrivateUse1 tensors to: an extension device of their index. PyTorch's
    `Tensor.__dlpack_device__` knows PrivateUse1 only by its unrenamed name and fails on `tpuc`."""
    from torch.utils.dlpack import DLDeviceType

    torch_dlpack_device = torch.Tensor.__dlpack_device__

    def __dlpack_device__(self):
        if type(self) is torch.Tensor and self.device.type == NAME:
            return DLDeviceType.kDLExtDev, self.device.index or 0
        return torch_dlpack_device(self)

    torch.Tensor.__dlpack_device__ = __dlpack_device__


def device_count() -> int:
    """The devices of the tpuc device: every device of the plugin (TPUC_DEVICES chooses how
    many the CPU plugin has; one by default)."""
    return _session().runtime.each_devices


def _index(device=None) -> int:
    """The device index `device` names (an index, `"tpuc:N"`, a torch.device; None: the
    current one), checked against the devices there are."""
    if device is None:
        return current_device()
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != NAME:
            raise ValueError(f"tpuc: {device} is not a tpuc device")
        index = 0 if device.index is None else device.index
    elif isinstance(device, int) and not isinstance(device, bool):
        index = device
    else:
        raise TypeError(f"tpuc: a device is an index, 'tpuc:N' or a torch.device, not {device!r}")
    count = device_count()
    if not 0 <= index < count:
        raise RuntimeError(f"tpuc: there is no device {NAME}:{index}: the tpuc device has {count} "
                           f"device(s), {NAME}:0 to {NAME}:{count - 1}")
    return index


# The current device's index (a device whose guard keeps it per thread reads and sets that
# instead: `attach(guard=True)`, the native device's).
_CURRENT = [0]
_GUARD = [False]


def current_device() -> int:
    if _GUARD[0]:
        return torch._C._accelerator_getDeviceIndex()
    return _CURRENT[0]


def set_device(device) -> None:
    index = _index(device)
    if _GUARD[0]:
        torch._C._accelerator_setDeviceIndex(index)
    else:
        _CURRENT[0] = index


class device:
    """Makes `device` the current device inside a `with` block (as `torch.cuda.device`)."""

    def __init__(self, device):
        self.index = -1 if device is None else _index(device)
        self.previous = -1

    def __enter__(self):
        if self.index >= 0:
            self.previous = current_device()
            set_device(self.index)
        return self

    def __exit__(self, *exc) -> bool:
        if self.index >= 0:
            set_device(self.previous)
        return False


def synchronize(device=None) -> None:
    """Waits for every op given to the device so far (fused mode's recorded ops run first)."""
    _index(device)
    _FLUSH[0]()
    _session().runtime.synchronize()


class Stream(torch.Stream):
    """The device's queue of ops. Every stream of a device is that one queue: ops run in the
    order they were given, so waiting on another stream or event holds already. A `torch.Stream`
    (libraries read its `stream_id`, `device_index` and `device_type`)."""

    def __new__(cls, device=None, priority: int = 0, **kwargs):
        return super().__new__(cls, stream_id=0, device_index=_index(device),
                               device_type=int(torch._C._autograd.DeviceType.PrivateUse1))

    def __init__(self, device=None, priority: int = 0, **kwargs):
        self.priority = priority

    def synchronize(self) -> None:
        synchronize(self.device)

    def query(self) -> bool:
        """Whether the work given so far is done (waits for it: the runtime does not say less)."""
        self.synchronize()
        return True

    def wait_event(self, event: Event) -> None:
        return None

    def wait_stream(self, stream: torch.Stream) -> None:
        return None

    def record_event(self, event: Event | None = None) -> Event:
        event = event if event is not None else Event()
        event.record(self)
        return event

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        return False

    def __repr__(self) -> str:
        return f"<torch.tpuc.Stream device={self.device}>"


def current_stream(device=None) -> Stream:
    return Stream(device)


def default_stream(device=None) -> Stream:
    return Stream(device)


def set_stream(stream: Stream) -> None:
    _index(stream.device)


def stream(stream: Stream | None) -> Stream | _NoStream:
    """A `with` block on `stream`: its device's one queue, so nothing changes inside."""
    return stream if stream is not None else _NoStream()


class _NoStream:
    def __enter__(self):
        return None

    def __exit__(self, *exc) -> bool:
        return False


class Event:
    """A point in the device's queue: `record` waits for the work before it and notes the
    time, so two timed events measure the device work between them (in milliseconds)."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        if interprocess:
            raise NotImplementedError("tpuc: events shared between processes are not supported")
        self.enable_timing = enable_timing
        self.blocking = blocking
        self.time: float | None = None

    def record(self, stream: Stream | None = None) -> None:
        (stream or current_stream()).synchronize()
        self.time = time.perf_counter()

    def wait(self, stream: Stream | None = None) -> None:
        return None

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        # `record` waited for the work before the event already.
        return None

    def elapsed_time(self, end: Event) -> float:
        if not (self.enable_timing and end.enable_timing):
            raise RuntimeError("tpuc: both events must be created with enable_timing=True")
        if self.time is None or end.time is None:
            raise RuntimeError("tpuc: both events must be recorded before elapsed_time")
        return (end.time - self.time) * 1e3


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def _is_in_bad_fork() -> bool:
    return False


# Each device has its own random state, as CUDA's Philox generators do: a seed and an offset
# (the native layer's generator.h). torch.manual_seed seeds every device (manual_seed_all).
_U64 = (1 << 64) - 1


def manual_seed(seed: int) -> None:
    _tpuc_native.set_random_state(current_device(), int(seed) & _U64, 0)


def manual_seed_all(seed: int) -> None:
    for index in range(device_count()):
        _tpuc_native.set_random_state(index, int(seed) & _U64, 0)


def seed() -> None:
    manual_seed(int.from_bytes(os.urandom(8), "little"))


def seed_all() -> None:
    manual_seed_all(int.from_bytes(os.urandom(8), "little"))


def initial_seed() -> int:
    return _tpuc_native.random_state(current_device())[0]


def get_rng_state(device=None) -> torch.Tensor:
    """Device `device`'s random state: 16 bytes, its seed and its offset (uint64 each), as a
    CUDA device's Philox state is laid out (DTensor's random ops read and move its offset)."""
    seed_, offset = _tpuc_native.random_state(_index(device))
    return torch.frombuffer(bytearray(struct.pack("<QQ", seed_, offset)), dtype=torch.uint8)


def set_rng_state(state: torch.Tensor, device=None) -> None:
    index = _index(device)
    if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8 or state.numel() != 16:
        what = f"a {state.dtype} tensor of {state.numel()} elements" if isinstance(state, torch.Tensor) else \
            type(state).__name__
        raise RuntimeError(f"tpuc: a device's random state is 16 bytes (uint8: its seed and offset, as "
                           f"torch.tpuc.get_rng_state gives it), not {what}")
    seed_, offset = struct.unpack("<QQ", bytes(state.cpu().contiguous().tolist()))
    _tpuc_native.set_random_state(index, seed_, offset)


def get_rng_state_all() -> list:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(states: list) -> None:
    for index, state in enumerate(states):
        set_rng_state(state, index)


class DeviceProperties(NamedTuple):
    """What `get_device_properties` tells of a device."""

    name: str
    platform: str
    index: int
    # Bytes the device can hold: the host's memory for the CPU plugin; 0 where the plugin
    # does not say.
    total_memory: int


def _host_memory() -> tuple[int, int]:
    """(available, total) bytes of the host's memory, from /proc/meminfo."""
    fields = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields[key] = int(value.split()[0]) * 1024
    return fields.get("MemAvailable", fields.get("MemFree", 0)), fields.get("MemTotal", 0)


def get_device_properties(device=None) -> DeviceProperties:
    index = _index(device)
    platform = _session().runtime.platform
    total = _host_memory()[1] if platform == "cpu" and os.path.exists("/proc/meminfo") else 0
    return DeviceProperties(name=f"tpuc ({platform} via PJRT)", platform=platform, index=index,
                            total_memory=total)


def get_device_name(device=None) -> str:
    return get_device_properties(device).name


def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) bytes of the device: the host's for the CPU plugin."""
    if get_device_properties(device).platform != "cpu":
        raise RuntimeError("tpuc: this plugin does not report its device's memory")
    return _host_memory()


def memory_allocated(device=None) -> int:
    """Bytes of the buffers alive on the device: its tensors', and what the compile backend keeps
    there (weights it uploaded, values derived from them)."""
    return _session().runtime.memory_use(_index(device))[0]


def max_memory_allocated(device=None) -> int:
    """The most `memory_allocated` has been since the process started or the last
    `reset_peak_memory_stats`."""
    return _session().runtime.memory_use(_index(device))[1]


def reset_peak_memory_stats(device=None) -> None:
    _session().runtime.reset_peak_memory(_index(device))


def reset_max_memory_allocated(device=None) -> None:
    reset_peak_memory_stats(device)


def memory_reserved(device=None) -> int:
    """What the device holds for tensors: their buffers themselves (tpuc keeps no cache of freed
    memory; the plugin allocates and frees each buffer)."""
    return memory_allocated(device)


def max_memory_reserved(device=None) -> int:
    return max_memory_allocated(device)


def memory_stats(device=None) -> dict:
    """`torch.cuda.memory_stats`'s keys that tpuc counts."""
    allocated, peak = _session().runtime.memory_use(_index(device))
    return {"allocated_bytes.all.current": allocated, "allocated_bytes.all.peak": peak,
            "reserved_bytes.all.current": allocated, "reserved_bytes.all.peak": peak}


def empty_cache() -> None:
    """Nothing to give back: a tensor's device memory goes when the tensor does."""
    return None


def get_amp_supported_dtype() -> list:
    return [torch.float32, torch.bfloat16, torch.float16]


_CACHE_STATS: list[Callable[[], dict]] = []
_FLUSH: list[Callable[[], None]] = [lambda: None]


def attach(cache_stats: Callable[[], dict], flush: Callable[[], None], guard: bool = False) -> None:
    """Called by the eager device when it registers this module as `torch.tpuc`: what the
    module reports of the device's own (its cache of programs), what runs the ops fused mode
    recorded, and whether the device's guard keeps the current device (per thread, as CUDA's)."""
    _CACHE_STATS[:] = [cache_stats]
    _FLUSH[0] = flush
    _GUARD[0] = guard


def cache_stats() -> dict:
    """What the eager device's cache of programs did in this process (see
    `tpuc.device.cache_stats`)."""
    if not _CACHE_STATS:
        raise RuntimeError("tpuc: the tpuc device is not registered in this process")
    return _CACHE_STATS[0]()
