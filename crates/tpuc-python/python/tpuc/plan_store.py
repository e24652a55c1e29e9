"""The device's plans on disk, in the compile cache's `device-plans` directory: what an op on
arguments of one native key compiles to (its program, constants and how its arguments and
results map to them), so that a second process runs what an earlier one planned without tracing
or lowering it again; the executable itself comes from the compile cache.

A plan is found by a hash of the op, its native key (native/ops.cpp: each argument's kind,
dtype, sizes, strides, storage and number), the build (tpuc's Python sources and native
libraries, torch's version), the planner's options and the settings tracing reads (the default
dtype, deterministic algorithms). Files are written whole (a temporary file renamed into place)
and checked when read: a damaged or unreadable plan is planned again and replaced; failing to
store never fails an op. The plans are kept under an eighth of the compile cache's size limit,
the least recently used going first."""
from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import pickle
import tempfile

import torch

from . import _tpuc

_MAGIC = b"TPUCPLAN1\n"
_SUFFIX = ".plan"
# Stores between two looks at the directory's size.
_PRUNE_EVERY = 500
_stores_since_pruned = _PRUNE_EVERY  # the first store looks


@functools.cache
def _configured() -> tuple[str, int] | None:
    try:
        found = _tpuc.device_plans_dir()
    except _tpuc.TpucError:  # misconfigured: the runtime reports it itself
        return None
    return None if found is None else (str(found[0]), found[1] // 8)


def directory() -> str | None:
    """The plans' directory (None: the compile cache is off)."""
    configured = _configured()
    return None if configured is None else configured[0]


@functools.cache
def _build() -> bytes:
    """What makes this build's plans its own: a plan is only as good as the planner that made it."""
    digest = hashlib.sha256(_MAGIC + torch.__version__.encode())
    package = os.path.dirname(os.path.abspath(__file__))
    for name in sorted(os.listdir(package)):
        path = os.path.join(package, name)
        if name.endswith(".py"):
            with open(path, "rb") as source:
                digest.update(name.encode() + b"\0" + source.read())
        elif name.endswith(".so"):  # large: named by size and time, as the compile cache names plugins
            status = os.stat(path)
            digest.update(f"{name}\0{status.st_size}\0{status.st_mtime_ns}".encode())
    return digest.digest()


def key(name: str, overload: str, types: bytes, values: bytes, settings: str) -> str:
    """The file name of the plan of op `name.overload` on arguments of native key `types` and
    `values` (empty for a plan serving every value of its floats), under `settings` (the
    planner's options and what else its tracing reads)."""
    digest = hashlib.sha256(_build())
    for part in (name.encode(), overload.encode(), settings.encode(), types, values):
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part)
    return digest.hexdigest()


def load(name: str) -> dict | None:
    """The plan stored as `name`, or None (none, or unreadable: planned again)."""
    folder = directory()
    if folder is None:
        return None
    try:
        with open(os.path.join(folder, name + _SUFFIX), "rb") as stored:
            data = stored.read()
    except OSError:
        return None
    checksum, payload = data[len(_MAGIC):len(_MAGIC) + 32], data[len(_MAGIC) + 32:]
    if not data.startswith(_MAGIC) or hashlib.sha256(payload).digest() != checksum:
        return None
    try:
        plan = pickle.loads(payload)
    except Exception:  # noqa: BLE001 - a damaged plan is planned again, whatever the damage
        return None
    with contextlib.suppress(OSError):
        os.utime(os.path.join(folder, name + _SUFFIX))  # used: pruned last
    return plan


def store(name: str, plan: dict) -> bool:
    """Stores `plan` as `name`; False when it cannot (an object that does not pickle, an
    unwritable directory): the op was planned all the same."""
    folder = directory()
    if folder is None:
        return False
    try:
        payload = pickle.dumps(plan, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - what does not pickle is planned again by the next process
        return False
    try:
        os.makedirs(folder, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=folder, prefix=name, suffix=".tmp")
    except OSError:
        return False
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(_MAGIC + hashlib.sha256(payload).digest() + payload)
        os.replace(temporary, os.path.join(folder, name + _SUFFIX))
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        return False
    global _stores_since_pruned
    _stores_since_pruned += 1
    if _stores_since_pruned >= _PRUNE_EVERY:
        _stores_since_pruned = 0
        prune(folder, _configured()[1])
    return True


def prune(folder: str, max_bytes: int) -> None:
    """Removes the least recently used plans of `folder` until they take at most `max_bytes`
    (to 90% of it, so that pruning is rare)."""
    plans = []
    with contextlib.suppress(OSError), os.scandir(folder) as listing:
        for entry in listing:
            if entry.name.endswith(_SUFFIX):
                with contextlib.suppress(OSError):
                    status = entry.stat()
                    plans.append((status.st_mtime, status.st_size, entry.path))
    total = sum(size for _, size, _ in plans)
    if total <= max_bytes:
        return
    for _, size, path in sorted(plans):
        if total <= max_bytes * 9 // 10:
            break
        with contextlib.suppress(OSError):
            os.unlink(path)
            total -= size


class StoredGraph:
    """An op's graph as kept with its plan, for fused mode, which joins graphs: its nodes (each
    node's operands as the numbers of earlier nodes), the constants they read and its inputs'
    types, from which every node gets its type (`meta["val"]`) again when fused mode asks.
    Nodes keep their names, which name what fused programs compute: the compile cache knows a
    program by them."""

    def __init__(self, nodes: list, constants: dict, inputs: list):
        self.nodes, self.constants, self.inputs = nodes, constants, inputs

    @classmethod
    def of(cls, gm: torch.fx.GraphModule) -> "StoredGraph":
        number = {node: _Node(k) for k, node in enumerate(gm.graph.nodes)}
        nodes, constants, inputs = [], {}, []
        for node in gm.graph.nodes:
            target = _Op(str(node.target)) if isinstance(node.target, torch._ops.OpOverload) else node.target
            nodes.append((node.op, node.name, target, torch.fx.node.map_arg(node.args, number.__getitem__),
                          torch.fx.node.map_arg(node.kwargs, number.__getitem__)))
            if node.op == "get_attr":
                constants[node.target] = getattr(gm, node.target)
            elif node.op == "placeholder":
                value = node.meta.get("val")
                if isinstance(value, torch.Tensor):
                    inputs.append((tuple(value.shape), tuple(value.stride()), value.dtype, value.device.type))
                else:
                    inputs.append(("value", value))
        return cls(nodes, constants, inputs)

    def graph(self) -> torch.fx.GraphModule:
        """The graph module, every node with its type, as traced."""
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.passes.fake_tensor_prop import FakeTensorProp

        graph = torch.fx.Graph()
        made: list[torch.fx.Node] = []

        def node_of(value):
            return made[value.number] if isinstance(value, _Node) else value

        for op, name, target, args, kwargs in self.nodes:
            args, kwargs = torch.utils._pytree.tree_map(node_of, (args, kwargs))
            target = target.overload() if isinstance(target, _Op) else target
            made.append(graph.create_node(op, target, args, kwargs, name=name))
        root = torch.nn.Module()
        for target, value in self.constants.items():
            setattr(root, target, value)
        module = torch.fx.GraphModule(root, graph)
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        with mode:
            values = [spec[1] if spec[0] == "value" else
                      torch.empty_strided(spec[0], spec[1], dtype=spec[2], device=spec[3]) for spec in self.inputs]
        FakeTensorProp(module, mode).propagate_dont_convert_inputs(*values)
        return module


class _Node:
    """A node of a stored graph, by its place (no tuple: a tree map must not enter it)."""

    __slots__ = ("number",)

    def __init__(self, number: int):
        self.number = number


class _Op:
    """An op of a stored graph by its name (`aten.add.Tensor`): ops do not pickle."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def overload(self) -> torch._ops.OpOverload:
        namespace, op, overload = self.name.split(".")
        return getattr(getattr(getattr(torch.ops, namespace), op), overload)
