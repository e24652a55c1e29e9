"""Device meshes and partition specs for torch.compile(backend="tpuc"), in the manner of
torch_xla's SPMD API and JAX: a `Mesh` of named axes, `mark_sharding(tensor, mesh, spec)` for a
model's inputs and parameters, `shard(model, mesh, plan)` to lay a whole model out with a ready
plan (`dp`, `fsdp`, `tp`, combined with commas) or rules. The layouts of what is not marked come
from the `plan` option; everything stays correct whatever the layout (XLA partitions the
program), only memory and communication change. See docs/sharding.md."""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import torch

from . import _tpuc
from .runtime import dtype_name

# The attribute mark_sharding and shard set on a tensor: (mesh text, spec as lists of axes, the
# spec its uses see where that differs, a weight the plan fsdp gathers at use, else None).
ATTRIBUTE = "_tpuc_sharding"

# Without a plan, what is not marked is whole.
_NO_PLAN = _tpuc.Plan({})


# Devices in a grid of named axes, numbered row-major: `Mesh((2, 2), ("fsdp", "tp"))`, or
# `Mesh.parse("fsdp=2,tp=2")` (the extension's, checked where it is made).
Mesh = _tpuc.Mesh


def mesh_text(mesh: Mesh | str) -> str:
    """The text form of a mesh given as a `Mesh` or as text."""
    return str(Mesh.of(mesh))


def normalize_spec(spec: Iterable, mesh: Mesh | str | None = None) -> list[list[str]]:
    """A partition spec (per dimension: None, an axis name, or a tuple of names, major first) as
    lists of axes. Names must be axes of `mesh` when it is given. (Plain Python: Dynamo traces
    it inside a model's `sharding_constraint`.)"""
    if isinstance(spec, str):
        raise TypeError(f"a partition spec has one entry per dimension, e.g. ({spec!r}, None), not {spec!r}")
    out = []
    for entry in spec:
        if entry is None:
            out.append([])
        elif isinstance(entry, str):
            out.append([entry])
        elif isinstance(entry, (tuple, list)) and all(isinstance(a, str) for a in entry):
            out.append(list(entry))
        else:
            raise TypeError(f"a partition spec entry is None, an axis name or a tuple of names, not {entry!r}")
    if mesh is not None:
        mesh = Mesh.of(mesh)
        unknown = sorted({a for dims in out for a in dims} - set(mesh.axis_names))
        if unknown:
            raise ValueError(f"the mesh {mesh} has no axis {', '.join(map(repr, unknown))}")
    return out


def mark_sharding(tensor: torch.Tensor, mesh: Mesh | str, spec: Iterable) -> torch.Tensor:
    """Lays `tensor` (a model's input or parameter) out over `mesh` as `spec` says, for graphs
    torch.compile(backend="tpuc", options={"mesh": mesh}) compiles; returns the tensor."""
    setattr(tensor, ATTRIBUTE, (mesh_text(mesh), normalize_spec(spec, mesh), None))
    return tensor


def shard(model: torch.nn.Module, mesh: Mesh | str, plan) -> torch.nn.Module:
    """Marks every parameter and buffer of `model` with the layout `plan` gives it over `mesh`
    (a `tpuc.Plan` or what makes one); returns the model."""
    named = list(model.named_parameters()) + list(model.named_buffers())
    layouts = _tpuc.Plan(plan).resolve(mesh, [described(name, t) for name, t in named], [])
    for (_, tensor), (spec, at_use) in zip(named, layouts):
        setattr(tensor, ATTRIBUTE, (mesh_text(mesh), spec, at_use))
    return model


_SOURCE_KEY = re.compile(r"_(?:modules|parameters|buffers)\['([^']*)'\]")


def qualified_name(source_name: str) -> str | None:
    """The parameter's name (`blocks.0.attn.q.weight`) from Dynamo's source of a graph input
    (`L['self']._modules['blocks']._modules['0']..._parameters['weight']`); None for inputs that
    are not a module's parameters or buffers."""
    if "_parameters[" not in source_name and "_buffers[" not in source_name:
        return None
    keys = _SOURCE_KEY.findall(source_name)
    return ".".join(keys) if keys else None


def described(name: str, tensor: torch.Tensor) -> tuple[str, str, list[int]]:
    """A tensor as a plan resolves it: its name, dtype and shape."""
    return name, dtype_name(tensor.dtype), list(tensor.shape)


def input_specs(gm: torch.fx.GraphModule, example_inputs: Sequence, mesh: Mesh,
                plan: _tpuc.Plan | None) -> tuple[list, list]:
    """The spec of each input of the Dynamo graph `gm`: its own mark (mark_sharding, shard) if it
    has one, else the plan's, weights by their names and the rest as inputs; and, per input, the
    spec its uses see where that differs (a weight the plan fsdp gathers at use), else None."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    weights, inputs, where = [], [], []
    specs: list = [None] * len(placeholders)
    at_use: list = [None] * len(placeholders)
    for i, (node, value) in enumerate(zip(placeholders, example_inputs)):
        if not isinstance(value, torch.Tensor):
            continue
        marked = getattr(value, ATTRIBUTE, None)
        if marked is not None:
            marked_mesh, specs[i], at_use[i] = marked
            if marked_mesh != str(mesh):
                raise ValueError(f"input {node.name} is marked for the mesh {marked_mesh}, but the graph "
                                 f"compiles for {mesh}")
            continue
        grapharg = node.meta.get("grapharg")
        name = qualified_name(grapharg.source.name) if grapharg is not None else None
        (weights if name else inputs).append(described(name or node.name, value))
        where.append((name is not None, i))
    resolved = (plan or _NO_PLAN).resolve(mesh, weights, inputs)
    by_weight, by_input = iter(resolved[: len(weights)]), iter(resolved[len(weights):])
    for is_weight, i in where:
        specs[i], at_use[i] = next(by_weight) if is_weight else next(by_input)
    return specs, at_use


# Ops that only re-read a tensor's elements in another shape or order: cheap to compute again.
_RESHAPING = ("aten.t.", "aten.permute.", "aten.transpose.", "aten.view.", "aten._unsafe_view.",
              "aten.reshape.", "aten.expand.", "aten.unsqueeze.", "aten.squeeze.")


def recompute_gathered(joint: torch.fx.GraphModule) -> None:
    """Marks for recomputation in the backward what aot_autograd's joint graph only reshapes from
    a weight gathered at use (`gather_at_use`), so that the backward gathers the weight again from
    its part, as FSDP does, instead of the forward keeping the whole weight for it."""
    policy = torch.utils.checkpoint.CheckpointPolicy.MUST_RECOMPUTE
    for node in joint.graph.nodes:
        if node.op != "call_function" or not node.args or not isinstance(node.args[0], torch.fx.Node):
            continue
        if str(node.target).startswith(_RESHAPING) and node.args[0].meta.get("recompute") == policy:
            node.meta["recompute"] = policy


def gather_at_use(gm: torch.fx.GraphModule, at_use: list, mesh: Mesh) -> None:
    """Constrains each input of the Dynamo graph `gm` that `at_use` gives a spec (from
    `input_specs`) to it before any use, in place: aot_autograd then traces the constraint into
    the forward and, through its gradient, the backward."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    changed = False
    for node, spec in zip(placeholders, at_use):
        if spec is None or not node.users:
            continue
        with gm.graph.inserting_after(node):
            used = gm.graph.call_function(torch.ops.tpuc.sharding_constraint.default,
                                          (node, str(mesh), spec_text(spec)))
        used.meta["val"] = node.meta.get("val")
        # The backward gathers again rather than keeping the whole weight from the forward.
        used.meta["recompute"] = torch.utils.checkpoint.CheckpointPolicy.MUST_RECOMPUTE
        node.replace_all_uses_with(used, delete_user_cb=lambda user, used=used: user is not used)
        changed = True
    if changed:
        gm.recompile()


def batch_split(gm: torch.fx.GraphModule, example_inputs: Sequence, specs: list) -> tuple | None:
    """(row counts, axes) when the Dynamo graph's inputs that are not weights and are split
    along their first dimension (`specs`: their layouts, from `input_specs`) all split a batch
    of one size over the same axes; else None.
    The row counts are the sizes a batch-major value's first dimension has: the batch, and the
    batch with the inputs' next dimensions flattened into it (`[batch * seq, dim]`)."""
    found, rows = set(), set()
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, value, spec in zip(placeholders, example_inputs, specs):
        grapharg = node.meta.get("grapharg")
        weight = grapharg is not None and qualified_name(grapharg.source.name) is not None
        if isinstance(value, torch.Tensor) and value.dim() and spec and spec[0] and not weight:
            found.add((int(value.shape[0]), tuple(spec[0])))
            count = 1
            for size in value.shape:
                count *= int(size)
                rows.add(count)
    if len(found) != 1:
        return None
    return frozenset(rows), next(iter(found))[1]


# Dynamo's sources of an optimizer's parameters and of its state, which it keys by parameter:
# `L['self'].param_groups[0]['params'][3]`, `L['self'].state[list(dict.keys(L['self'].state))[3]]...`.
_GROUP_PARAM = re.compile(r"\.param_groups\[(\d+)\]\['params'\]\[(\d+)\]$")
_STATE_OF = re.compile(r"\.state\[list\(dict\.keys\([^)]*\.state\)\)\[(\d+)\]\]")


def attribute_specs(gm: torch.fx.GraphModule, mesh: Mesh, plan: _tpuc.Plan | None) -> list:
    """The spec of each tensor the Dynamo graph `gm` holds as an attribute, in the order
    aot_autograd passes them before the graph's inputs (parameters, then buffers): a graph
    compiled with its module's tensors as attributes, or an optimizer step's parameters and state.
    A tensor's own mark comes first, else the plan's by its name; an optimizer's state is laid out
    as the parameter it belongs to (the state's key, matched with the parameters in the order the
    optimizer holds them; whole where shapes differ)."""
    named = (list(gm.named_parameters(remove_duplicate=False))
             + list(gm.named_buffers(remove_duplicate=False)))
    if not named:
        return []
    sources = {name: source.name for name, source in (getattr(gm, "_param_name_to_source", None) or {}).items()}
    specs: list = [None] * len(named)
    unmarked = []
    for i, (name, tensor) in enumerate(named):
        marked = getattr(tensor, ATTRIBUTE, None)
        if marked is not None and marked[0] == str(mesh):
            specs[i] = marked[1]
        elif not _STATE_OF.search(sources.get(name, "")):
            unmarked.append(i)
    weights = [described(qualified_name(sources.get(named[i][0], "")) or named[i][0], named[i][1])
               for i in unmarked]
    # An attribute is used as it is laid out: an optimizer's step works on each device's part.
    for i, (spec, _) in zip(unmarked, (plan or _NO_PLAN).resolve(mesh, weights, [])):
        specs[i] = spec
    # An optimizer's parameters in its own order, which its state's keys follow.
    params = sorted((tuple(map(int, m.groups())), i) for i, (name, _) in enumerate(named)
                    if (m := _GROUP_PARAM.search(sources.get(name, ""))))
    for i, (name, tensor) in enumerate(named):
        state = _STATE_OF.search(sources.get(name, ""))
        if state is None or specs[i] is not None:
            continue
        k = int(state.group(1))
        if k < len(params):
            owner = params[k][1]
            if named[owner][1].shape == tensor.shape:
                specs[i] = specs[owner]
    return specs


@torch.library.custom_op("tpuc::sharding_constraint", mutates_args=())
def _sharding_constraint(x: torch.Tensor, mesh: str, spec: str) -> torch.Tensor:
    # Eager torch has one copy of every tensor: the layout changes nothing.
    return x.clone()


@_sharding_constraint.register_fake
def _(x: torch.Tensor, mesh: str, spec: str) -> torch.Tensor:
    return torch.empty_like(x)


def _constraint_setup(ctx, inputs, output):
    ctx.mesh, ctx.spec = inputs[1], inputs[2]


def _constraint_backward(ctx, grad):
    # The gradient is laid out as the value was.
    return torch.ops.tpuc.sharding_constraint(grad, ctx.mesh, ctx.spec), None, None


_sharding_constraint.register_autograd(_constraint_backward, setup_context=_constraint_setup)


def sharding_constraint(x: torch.Tensor, mesh: Mesh | str, spec: Iterable) -> torch.Tensor:
    """`x` laid out over `mesh` as `spec` says, inside a model: graphs torch.compile(backend=
    "tpuc") compiles over that mesh place the value there (and its gradient, in training);
    elsewhere it is `x` itself. The op survives Dynamo and aot_autograd as
    `tpuc::sharding_constraint(x, mesh, spec)`, the spec's text giving each dimension's axes
    separated by commas, several axes of a dimension joined by `+`."""
    # Plain Python Dynamo traces through; the compiler checks the mesh and the axes.
    mesh = str(mesh) if isinstance(mesh, Mesh) else mesh.replace(" ", "")
    return torch.ops.tpuc.sharding_constraint(x, mesh, spec_text(normalize_spec(spec)))


def spec_text(spec: list) -> str:
    """A spec (lists of axes) as the constraint op's argument: each dimension's axes separated by
    commas, several axes of a dimension joined by `+`."""
    return ",".join("+".join(axes) for axes in spec)
