"""One rank's program of a torch.distributed computation (DTensor, tensor parallel, SimpleFSDP,
or plain functional collectives) run as one SPMD program over N devices from a single process.

`tpuc.spmd(fn, mesh)` traces `fn` once, as rank 0 of a process group of N ranks (a fake one is
enough: `dist.init_process_group("fake", ...)`), into an ATen graph whose `_c10d_functional`
collectives tpuc lowers to StableHLO collectives inside a manual computation
(`sdy.manual_computation`). Device d runs the graph as rank d on rank d's arguments; XLA
communicates. Called with every rank's arguments, it returns every rank's results::

    step = tpuc.spmd(tp_step, mesh)                 # mesh: a torch DeviceMesh of N ranks
    per_rank = step([args_of_rank_0, args_of_rank_1])

Every rank must run the graph rank 0 traced: DTensor's collectives do, but code that branches
on `dist.get_rank()` or bakes a rank's coordinate into the graph does not (it would run rank 0's
choice everywhere). See docs/sharding.md.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from . import _tpuc
from .options import Options

_PROGRAM_IDS = itertools.count()


def process_groups(mesh) -> dict[str, list[list[int]]]:
    """The process groups of a torch `DeviceMesh` by name: for each mesh dimension, its groups
    of ranks (one per coordinate of the other dimensions); the default group spans all ranks."""
    ranks = mesh.mesh
    groups: dict[str, list[list[int]]] = {}
    for dim, name in enumerate(mesh._dim_group_names):
        along = ranks.movedim(dim, -1).reshape(-1, ranks.shape[dim])
        groups[name] = [[int(r) for r in row] for row in along.tolist()]
    import torch.distributed as dist

    if dist.is_initialized():
        world = dist.group.WORLD
        groups.setdefault(world.group_name, [list(range(dist.get_world_size()))])
    return groups


class RankProgram:
    """`fn` as one rank's program over `world_size` devices; see `spmd`."""

    def __init__(self, fn: Callable, world_size: int, groups: Mapping[str, Sequence[Sequence[int]]],
                 plugin: str | None = None, matmul_precision: str = "highest"):
        if world_size < 1:
            raise ValueError(f"world_size must be at least 1, not {world_size}")
        self.fn = fn
        self.world_size = world_size
        self.groups = {str(name): [[int(r) for r in g] for g in gs] for name, gs in groups.items()}
        for name, gs in self.groups.items():
            members = sorted(r for g in gs for r in g)
            if members != list(range(world_size)):
                raise ValueError(f"process group {name!r}: its groups {gs} do not hold each of the "
                                 f"{world_size} ranks once")
        self.opts = Options.parse({"plugin": plugin, "mesh": f"ranks={world_size}", "strict": True,
                                   "matmul_precision": matmul_precision, "hoist_weights": False})
        # Compiled graphs by the structure, dtypes and shapes of rank 0's arguments.
        self.compiled: dict[tuple, tuple] = {}

    def compiled_graphs(self) -> list:
        """The graphs compiled so far (one per distinct argument shapes), each with its
        `stablehlo` module."""
        return [compiled.compiled for compiled, _ in self.compiled.values()]

    def __call__(self, per_rank: Sequence[Sequence]) -> list:
        """Every rank's results (as `fn` returns them) from every rank's arguments (one sequence
        of `fn`'s arguments per rank, ranks in order)."""
        if len(per_rank) != self.world_size:
            raise ValueError(f"expected the arguments of {self.world_size} ranks, got {len(per_rank)}")
        flat = [pytree.tree_flatten(list(args)) for args in per_rank]
        leaves0, spec = flat[0]
        for rank, (leaves, other) in enumerate(flat[1:], start=1):
            if other != spec:
                raise ValueError(f"rank {rank}'s arguments are not structured as rank 0's")
            for i, (a, b) in enumerate(zip(leaves0, leaves)):
                if isinstance(a, torch.Tensor) != isinstance(b, torch.Tensor) or (
                        isinstance(a, torch.Tensor) and (a.shape, a.dtype) != (b.shape, b.dtype)):
                    raise ValueError(f"argument {i} of rank {rank} is {_describe(b)}, but rank 0's is "
                                     f"{_describe(a)}: every rank runs one program")
        for rank, (leaves, _) in enumerate(flat):
            for i, a in enumerate(leaves):
                if is_traceable_wrapper_subclass(a):
                    raise ValueError(f"argument {i} of rank {rank} is a {type(a).__name__}: pass each "
                                     "rank's own local tensor (to_local() of a DTensor)")
        key = (spec, tuple(_describe(a) for a in leaves0))
        found = self.compiled.get(key)
        if found is None:
            found = self.compiled[key] = self._compile(leaves0, spec)
        compiled, out_spec = found
        stacked = [torch.stack([f[0][i] for f in flat]) if isinstance(a, torch.Tensor) else a
                   for i, a in enumerate(leaves0)]
        results = compiled.call(stacked)
        results = results if isinstance(results, list) else [results]
        return [pytree.tree_unflatten([r[rank] if isinstance(r, torch.Tensor) else r for r in results], out_spec)
                for rank in range(self.world_size)]

    def _compile(self, leaves: list, spec):
        from torch.fx.experimental.proxy_tensor import make_fx

        from .compiler import GraphCompiler, decompositions

        out_spec = []

        def flat_fn(*flat_args):
            out = self.fn(*pytree.tree_unflatten(list(flat_args), spec))
            out_leaves, tree = pytree.tree_flatten(out)
            out_spec.append(tree)
            # A DTensor result is this rank's part of it, as `to_local` gives it.
            out_leaves = [_local(leaf) for leaf in out_leaves]
            for i, leaf in enumerate(out_leaves):
                if not isinstance(leaf, torch.Tensor):
                    raise _tpuc.TpucError(f"tpuc.spmd: result {i} of {_name(self.fn)} is of type "
                                          f"{type(leaf).__name__}, not a tensor")
            return out_leaves

        gm = make_fx(flat_fn, decomposition_table=decompositions(self.opts))(*leaves)
        compiler = GraphCompiler(self.opts)
        compiler.process_groups = self.groups
        name = f"spmd_{next(_PROGRAM_IDS):03d}_{_name(self.fn)}"
        return compiler.compile_whole(gm, name), out_spec[0]


def _local(value):
    from torch.distributed.tensor import DTensor

    return value.to_local() if isinstance(value, DTensor) else value


def spmd(fn: Callable, mesh=None, *, world_size: int | None = None,
         groups: Mapping[str, Sequence[Sequence[int]]] | None = None,
         plugin: str | None = None, matmul_precision: str = "highest") -> RankProgram:
    """`fn`, one rank's program, run on `world_size` devices, device d as rank d.

    mesh:        a torch DeviceMesh of the ranks: its process groups (and the default group)
                 are the ones `fn`'s collectives may name, and its size is the world size.
    world_size:  without a mesh, the number of ranks; `groups` then names the process groups.
    groups:      process groups by name, each as its groups of ranks ({"0": [[0, 1, 2, 3]]}).
    plugin:      the PJRT plugin (as the backend's option), with that many devices.

    `fn` is traced (torch's make_fx, tpuc's decompositions) on rank 0's arguments at the first
    call and compiled once per argument shapes; it takes and returns tensors (nested in lists,
    tuples or dicts)."""
    if mesh is not None:
        found = process_groups(mesh)
        groups = {**found, **(groups or {})}
        size = mesh.mesh.numel()
        if world_size is not None and world_size != size:
            raise ValueError(f"world_size {world_size} disagrees with the mesh's {size} ranks")
        world_size = size
    if world_size is None or groups is None:
        raise ValueError("tpuc.spmd needs a DeviceMesh, or world_size and groups")
    return RankProgram(fn, world_size, groups, plugin, matmul_precision)


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).removeprefix('torch.')} tensor of shape {list(value.shape)}"
    return repr(value)


def _name(fn) -> str:
    return getattr(fn, "__name__", type(fn).__name__)
