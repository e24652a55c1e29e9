"""Fused eager mode of the tpuc device: ops are recorded, not run, until a value is needed; the
recorded run is then compiled as one program through the pipeline and cached by its structure,
so the same steps of a loop run one executable.

A recorded op is its trace (the device's `_OpTrace`, the one strict mode compiles alone) and where each
of its inputs comes from: a buffer on the device, a Python float it takes as an input, or an
output of an earlier recorded op. The tensors it makes hold `Pending` values. A run ends when a
value is read (`.cpu()`, `.item()`, printing, a data-dependent branch), at
`torch.tpuc.synchronize()`, after each optimizer step (so a training loop's steps are runs of the
same structure), at an op tpuc cannot lower, and after `max_ops` ops. Its program returns the
values of the run that are still referenced (by live tensors) when it ends; the rest stay inside
it, where XLA fuses them away.
"""
from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import NamedTuple

import torch

from . import _tpuc

# What fused mode does: whether it is on, and the most ops a run records.
_STATE = {"on": False, "max_ops": 1000, "hooked": False}
_CURRENT: list = []  # the run being recorded, if any
# Programs of recorded runs, by the run's structure: its ops and the values it returns.
_PROGRAMS: dict = {}


class DeviceFunctions(NamedTuple):
    """What recording and running need of the device, given by it (`attach_device`): this
    module does not import the device, which imports it.

    value:         `value(tensor)`, a device tensor's value (a buffer or a `Pending`).
    scalar_buffer: `scalar_buffer(number, dtype)`, a Python number on the device.
    new:           `new(pending, dtype, shape, strides, numel)`, a device tensor holding a
                   pending value.
    compile:       `compile(name, gm)`, a graph compiled as strict mode compiles an op's.
    execute:       `execute(name, program, buffers)`, a compiled program's outputs.
    run_trace:     `run_trace(trace, buffers)`, one op run as strict mode runs it.
    cannot_run:    `cannot_run(error)`, why an op cannot run on the device, or None.
    count:         `count(miss)`, a cache lookup of the device's programs (a miss's reason).
    """

    value: Callable
    scalar_buffer: Callable
    new: Callable
    compile: Callable
    execute: Callable
    run_trace: Callable
    cannot_run: Callable
    count: Callable


_DEVICE: list = []  # the device's functions, once attached


def attach_device(functions: DeviceFunctions) -> None:
    _DEVICE[:] = [functions]


class Pending:
    """A value a recorded op computes: output `index` of its run, `buffer` once it ran."""

    __slots__ = ("run", "index", "buffer", "__weakref__")

    def __init__(self, run: "_Run", index: int):
        self.run, self.index, self.buffer = run, index, None


class _Run:
    """The ops recorded since the last run ended."""

    __slots__ = ("inputs", "positions", "ops", "pendings", "error")

    def __init__(self):
        self.inputs: list = []       # the buffers its ops read, first use first
        self.positions: dict = {}    # id(buffer) -> its position in `inputs`
        self.ops: list = []          # (trace, where each of its inputs comes from)
        self.pendings: list = []     # a weak reference to each value it computes, in order
        self.error: Exception | None = None

    def source(self, value) -> int:
        """Where an op's input comes from: an earlier op's output (its index, >= 0) or the run's
        input -1 - position."""
        if type(value) is Pending:
            if value.buffer is not None:
                value = value.buffer
            elif value.run is self:
                return value.index
            else:
                raise _failed(value)
        position = self.positions.get(id(value))
        if position is None:
            position = self.positions[id(value)] = len(self.inputs)
            self.inputs.append(value)
        return -1 - position

    def new_input(self, buffer) -> int:
        """An input of its own (a lifted float: equal values of two ops are two inputs, so that
        the run's structure does not depend on values)."""
        self.inputs.append(buffer)
        return -len(self.inputs)


def enable(on: bool = True, *, max_ops: int = 1000) -> None:
    """Fused mode on (ops recorded and run in fused runs) or off (what was recorded runs; ops run
    one by one again)."""
    if not isinstance(max_ops, int) or max_ops < 1:
        raise _tpuc.TpucError(f"fused mode: max_ops must be a positive integer, not {max_ops!r}")
    if not on:
        flush()
    _STATE.update(on=on, max_ops=max_ops)
    if on and not _STATE["hooked"]:
        # An optimizer step ends a run: each step of a training loop records the same ops.
        from torch.optim.optimizer import register_optimizer_step_post_hook
        register_optimizer_step_post_hook(lambda *_: flush())
        _STATE["hooked"] = True


def recording() -> bool:
    return _STATE["on"]


def record(trace, tensors: list, floats: list) -> list:
    """Records `trace` run on `tensors` (and the lifted `floats`); the tensors it returns, as its
    graph's outputs are (its inputs, or new tensors holding pending values)."""
    device = _DEVICE[0]
    values = [device.value(t) for t in tensors]
    run = _CURRENT[0] if _CURRENT else None
    if run is None:
        run = _Run()
        _CURRENT.append(run)
    sources = [run.source(v) for v in values]
    for value in floats:
        sources.append(run.new_input(device.scalar_buffer(value, trace.scalar_dtype)))
    run.ops.append((trace, tuple(sources)))
    results = []
    for output in trace.outputs:
        if output[0] == "arg":
            results.append(tensors[output[1]])
            continue
        pending = Pending(run, len(run.pendings))
        run.pendings.append(weakref.ref(pending))
        results.append(device.new(pending, output[1], output[2], output[3], output[4]))
    if len(run.ops) >= _STATE["max_ops"]:
        flush()
    return results


def resolve(value: Pending):
    """The buffer of a pending value: its run runs first if it has not."""
    if value.buffer is None and _CURRENT and value.run is _CURRENT[0]:
        flush()
    if value.buffer is None:
        raise _failed(value)
    return value.buffer


def _failed(value: Pending) -> Exception:
    cause = value.run.error
    return _tpuc.TpucError("a tensor of the tpuc device has no value: the fused run that computes it failed"
                           + (f" ({cause})" if cause is not None else ""))


def flush() -> None:
    """Runs what was recorded (one program per run's structure, compiled once), giving each
    pending value still referenced its buffer."""
    if not _CURRENT:
        return
    run = _CURRENT.pop()
    if not run.ops:
        return
    device = _DEVICE[0]
    live = [(i, p) for i, ref in enumerate(run.pendings) if (p := ref()) is not None]
    key = (tuple(run.ops), tuple(i for i, _ in live))
    program = _PROGRAMS.get(key)
    try:
        if program is None:
            program = device.compile(f"fused_{len(run.ops)}_ops", _graph(run, [i for i, _ in live]))
            _PROGRAMS[key] = program
            device.count("new recorded run")
        else:
            device.count(None)
        results = device.execute("a fused run", program, run.inputs)
    except _tpuc.TpucError as error:
        if device.cannot_run(error) is None:
            run.error = error
            raise
        # An op tpuc lowers for some arguments, not these: each op alone, as strict mode would.
        _replay(run, live)
        return
    for (_, pending), buffer in zip(live, program.output_buffers(results, run.inputs)):
        pending.buffer = buffer



def _graph(run: _Run, returned: list) -> torch.fx.GraphModule:
    """The run's ops as one graph: the run's inputs as placeholders, each op's graph inlined on
    its sources, the values at `returned` as outputs."""
    graph = torch.fx.Graph()
    root = torch.nn.Module()
    # Each input's type, from the first op that reads it.
    types: list = [None] * len(run.inputs)
    for trace, sources in run.ops:
        for node, source in zip(_placeholders(trace.gm), sources):
            if source < 0 and types[-1 - source] is None:
                types[-1 - source] = node.meta["val"]
    inputs = []
    for position, value in enumerate(types):
        node = graph.placeholder(f"input_{position}")
        node.meta["val"] = value
        inputs.append(node)
    computed: list = []
    for number, (trace, sources) in enumerate(run.ops):
        env = {node: inputs[-1 - source] if source < 0 else computed[source]
               for node, source in zip(_placeholders(trace.gm), sources)}
        for node in trace.gm.graph.nodes:
            if node.op == "placeholder":
                continue
            if node.op == "output":
                computed.extend(env[value] for value, output in zip(node.args[0], trace.outputs)
                                if output[0] == "new")
            elif node.op == "get_attr":
                name = f"constant_{number}_{node.target}"
                setattr(root, name, getattr(trace.gm, node.target))
                env[node] = graph.get_attr(name)
                env[node].meta = dict(node.meta)
            else:
                env[node] = graph.node_copy(node, lambda n, env=env: env[n])
    graph.output(tuple(computed[i] for i in returned))
    gm = torch.fx.GraphModule(root, graph)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


def _placeholders(gm: torch.fx.GraphModule) -> list:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


def _replay(run: _Run, live: list) -> None:
    """The run's ops run one by one, as in strict mode (an op tpuc cannot lower for its
    arguments on the CPU, with a warning)."""
    device = _DEVICE[0]
    values: list = []
    for trace, sources in run.ops:
        buffers = [run.inputs[-1 - s] if s < 0 else values[s] for s in sources]
        values.extend(device.run_trace(trace, buffers))
    for index, pending in live:
        pending.buffer = values[index]
