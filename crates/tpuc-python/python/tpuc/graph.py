"""ATen FX graphs as torch.export's serialized ExportedProgram, the form tpuc's compiler reads."""
from __future__ import annotations

import contextlib
import json
import logging
from collections import Counter
from collections.abc import Container

import torch
from torch._export.serde.serialize import SCHEMA_VERSION, GraphModuleSerializer, _dataclass_to_dict
from torch.export.graph_signature import (
    ExportGraphSignature,
    InputKind,
    InputSpec,
    OutputKind,
    OutputSpec,
    TensorArgument,
)

from . import _tpuc, kernels

# Node metadata the compiler reads; the rest (module stacks with types, ...) does not serialize.
_KEPT_META = ("val", "stack_trace")
# The key, in a node's "custom" metadata (which aot_autograd carries to the nodes it traces),
# naming the custom op whose implementation the node was traced from (`custom_ops.inline`).
CUSTOM_OP = "tpuc_custom_op"

aten = torch.ops.aten
prims = torch.ops.prims


def op_name(node: torch.fx.Node) -> str:
    """`aten.add.Tensor` for an ATen/prims overload, `higher_order.cond` for a higher-order
    operator (as the compiler names them; one that runs an op it is given, as
    `auto_functionalized` runs a custom op, with it: `higher_order.auto_functionalized_v2 of
    mylib.bump.default`), the Python name for anything else."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    if isinstance(target, torch._ops.HigherOrderOperator):
        runs = next((a for a in node.args if isinstance(a, torch._ops.OpOverload)), None)
        return f"higher_order.{target.name()}" + (f" of {runs}" if runs is not None else "")
    return getattr(target, "__qualname__", None) or str(target)


def subgraphs(node: torch.fx.Node) -> list[torch.fx.GraphModule]:
    """The graphs a higher-order operator's node runs (`torch.cond`'s branches, a loop's body):
    the graph modules its `get_attr` arguments name."""
    import operator

    owner = node.graph.owning_module
    if not isinstance(node.target, torch._ops.HigherOrderOperator) or owner is None:
        return []
    found = []
    for a in node.args:
        if isinstance(a, torch.fx.Node) and a.op == "get_attr":
            sub = operator.attrgetter(a.target)(owner)
            if isinstance(sub, torch.fx.GraphModule):
                found.append(sub)
    return found


# Where the operands a higher-order operator passes its subgraphs last (after any others, in
# the subgraphs' order) sit among its arguments: a list at that index (invoke_subgraph: every
# argument from there on).
_TRAILING_OPERANDS = {"cond": 3, "while_loop": 3, "scan": 3, "map_impl": 2, "associative_scan": 2,
                      "invoke_subgraph": 2}


def copy_module(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of `gm` whose graph can be changed; node metadata (fake tensors, which do not
    deep-copy) is shared, the module's tensors too."""
    graph = torch.fx.Graph()
    env: dict = {}
    for node in gm.graph.nodes:
        env[node] = graph.node_copy(node, lambda n: env[n])
    return torch.fx.GraphModule(gm, graph)


def _is_size_value(a) -> bool:
    return isinstance(a, int) and not isinstance(a, bool) or (
        isinstance(a, torch.fx.Node) and isinstance(a.meta.get("val"), torch.SymInt))


def sizes_within_subgraphs(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of `gm` in which no higher-order operator passes a size (a SymInt, or the int it
    became) to its subgraphs, which read it from the shape of a tensor they take instead (or
    as the constant it is). Dynamo passes the sizes a subgraph mentions so; torch's serializer
    takes no list mixing tensors and sizes, and tpuc's subgraphs take tensors. `gm` itself when
    no higher-order operator passes its subgraphs operands."""
    import operator

    def trailing_at(node):
        if not isinstance(node.target, torch._ops.HigherOrderOperator):
            return None
        at = _TRAILING_OPERANDS.get(node.target.name())
        return at if at is not None and len(node.args) > at else None

    if all(trailing_at(n) is None for n in gm.graph.nodes):
        return gm
    module = copy_module(gm)
    done: dict[str, torch.fx.GraphModule] = {}
    for node in module.graph.nodes:
        at = trailing_at(node)
        if at is None:
            continue
        flat = node.target.name() == "invoke_subgraph"
        trailing = list(node.args[at:] if flat else node.args[at])
        sizes = [j for j, a in enumerate(trailing) if _is_size_value(a)]
        for a in node.args:
            if isinstance(a, torch.fx.Node) and a.op == "get_attr" and a.target not in done:
                sub = operator.attrgetter(a.target)(gm)
                if isinstance(sub, torch.fx.GraphModule):
                    done[a.target] = _sizes_read_within(sub, [(j, trailing[j]) for j in sizes], len(trailing))
        if sizes:
            kept = [a for j, a in enumerate(trailing) if j not in sizes]
            node.args = ((*node.args[:at], *kept) if flat
                         else (*node.args[:at], type(node.args[at])(kept), *node.args[at + 1:]))
    module.recompile()
    for target, sub in done.items():
        setattr(module, target, sub)
    return module


def _sizes_read_within(sub: torch.fx.GraphModule, sizes: list, trailing: int) -> torch.fx.GraphModule:
    """A copy of subgraph `sub` without the inputs at `sizes` (positions among its last
    `trailing` inputs, with the values passed there): each read from a dimension of a tensor
    input of the same size, or the int it is."""
    module = sizes_within_subgraphs(copy_module(sub))
    graph = module.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    first = len(placeholders) - trailing
    dims = {}
    for p in placeholders:
        value = p.meta.get("val")
        if isinstance(value, torch.Tensor):
            for d, size in enumerate(value.shape):
                if isinstance(size, torch.SymInt):
                    dims.setdefault(size.node.expr, (p, d))
    anchor = placeholders[-1]
    for j, passed in sizes:
        p = placeholders[first + j]
        if p.users:
            value = p.meta.get("val")
            if isinstance(passed, int):
                replacement = passed
            elif isinstance(value, torch.SymInt) and value.node.expr in dims:
                tensor, d = dims[value.node.expr]
                with graph.inserting_after(anchor):
                    replacement = graph.call_function(torch.ops.aten.sym_size.int, (tensor, d))
                replacement.meta["val"] = value
                anchor = replacement
            else:
                raise _tpuc.TpucError(f"the size {p.name} a subgraph takes is no dimension of the tensors it takes")
            for user in list(p.users):
                user.args = torch.fx.node.map_arg(user.args, lambda x, p=p, r=replacement: r if x is p else x)
                user.kwargs = torch.fx.node.map_arg(user.kwargs, lambda x, p=p, r=replacement: r if x is p else x)
        graph.erase_node(p)
    module.recompile()
    return module


def call_target(node: torch.fx.Node) -> torch._ops.OpOverload | None:
    """The overload a call_function node calls (`torch.ops.ns.op(x)` calls its default one),
    or None for anything else."""
    if node.op != "call_function":
        return None
    target = node.target
    if isinstance(target, torch._ops.OpOverloadPacket):
        target = getattr(target, "default", None)
    return target if isinstance(target, torch._ops.OpOverload) else None


def is_structural(node: torch.fx.Node) -> bool:
    """getitem picks an output of a multi-output op; the serializer folds it into that op."""
    import operator

    return node.op == "call_function" and node.target is operator.getitem


# Effectful ops whose effect is a check of values the graph computes (torch.linalg's errors for
# singular or indefinite matrices): the backend runs them on the host after the call
# (`backend._host_checks`).
HOST_CHECKS = {torch.ops.aten._linalg_check_errors.default}


# Assertions of a program (torch.export's shape checks, `torch._assert_async`): they cannot be
# compiled, so the backend checks them on the host at each call, never dropping one.
HOST_ASSERTS = {
    torch.ops.aten._assert_async.default,
    torch.ops.aten._assert_async.msg,
    torch.ops.aten._assert_scalar.default,
    torch.ops.aten.sym_constrain_range.default,
    torch.ops.aten.sym_constrain_range_for_size.default,
}


def is_host_check(node: torch.fx.Node) -> bool:
    """A `with_effects` node of one of the `HOST_CHECKS`, or one of the `HOST_ASSERTS`."""
    if node.op != "call_function":
        return False
    if node.target in HOST_ASSERTS:
        return True
    return (node.target is torch.ops.higher_order.with_effects
            and len(node.args) >= 2 and node.args[1] in HOST_CHECKS)


def data_dependent_sizes(node: torch.fx.Node) -> list[str]:
    """The symbols in a node's result sizes that tensor values decide (torch's unbacked symbols:
    `nonzero`, `repeat_interleave` without `output_size`, `.item()` used as a size), sorted;
    empty when its sizes are known before the call. tpuc compiles static sizes, so such nodes run
    in eager torch (or are refused in strict mode)."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    return sorted(str(s) for s in free_unbacked_symbols(node.meta.get("val")))


def unsupported_ops(gm: torch.fx.GraphModule, supported: Container[str]) -> Counter:
    """Counts of the call_function ops of `gm` that tpuc does not compile (`lowerable`; host
    checks are run by the backend)."""
    counts: Counter = Counter()
    for node in gm.graph.nodes:
        if (node.op == "call_function" and not is_structural(node) and not is_host_check(node)
                and not lowerable(node, supported)):
            counts[op_name(node)] += 1
    return counts


def lowerable(node: torch.fx.Node, supported: Container[str]) -> bool:
    """Whether tpuc compiles `node`: its op is lowered, its sizes are known before the call,
    and so is every node of the graphs it runs."""
    return (op_name(node) in supported and not data_dependent_sizes(node)
            and not any(unsupported_ops(sub, supported) for sub in subgraphs(node)))


def source_line(node: torch.fx.Node) -> str | None:
    """The user's line (`file:line`) in a node's stack trace: the innermost frame outside
    installed packages, as the compiler reads it."""
    trace = node.meta.get("stack_trace")
    return _tpuc.source_line(trace) if trace else None


def serialize(gm: torch.fx.GraphModule, tensor_outputs: list[int]) -> bytes:
    """A copy of `gm` returning only the outputs at `tensor_outputs`, with every placeholder a
    user input, serialized as an ExportedProgram JSON."""
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    output_node = None
    for node in gm.graph.nodes:
        if node.op == "output":
            output_node = node
            break
        copy = graph.node_copy(node, lambda n: env[n])
        copy.meta = {k: v for k, v in node.meta.items() if k in _KEPT_META}
        if isinstance(node.target, torch._ops.HigherOrderOperator) and isinstance(copy.meta.get("val"), list):
            # aot_autograd records a higher-order operator's results (a backward `cond`'s) as a
            # list, which torch's serializer takes only as a tuple.
            copy.meta["val"] = tuple(copy.meta["val"])
        origin = node.meta.get("custom", {}).get(CUSTOM_OP)
        if origin is not None:
            # A node traced from a custom op's implementation is named after that op too: its
            # errors and locations say where it came from.
            copy._rename(f"{origin}_{copy.name}")
        env[node] = copy
    outputs = output_node.args[0] if output_node is not None else ()
    if not isinstance(outputs, (tuple, list)):
        outputs = (outputs,)
    returned = [env[outputs[i]] for i in tensor_outputs]
    graph.output(tuple(returned))
    module = torch.fx.GraphModule(gm, graph)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    signature = ExportGraphSignature(
        input_specs=[
            InputSpec(kind=InputKind.USER_INPUT, arg=TensorArgument(name=p.name), target=None)
            for p in placeholders
        ],
        output_specs=[
            OutputSpec(kind=OutputKind.USER_OUTPUT, arg=TensorArgument(name=r.name), target=None)
            for r in returned
        ],
    )
    with _empty_lists_unremarked():
        serialized = GraphModuleSerializer(signature, []).serialize(module)
    program = {
        "graph_module": _dataclass_to_dict(serialized),
        "schema_version": {"major": SCHEMA_VERSION[0], "minor": SCHEMA_VERSION[1]},
    }
    # The user kernels its calls need, beside torch's fields (tpuc_fx::kernels).
    found = kernels.document(gm)
    if found is not None:
        program["tpuc_kernels"] = found
    return json.dumps(program).encode()


class _EmptyListRemark(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "serialize the given empty list" not in record.getMessage()


@contextlib.contextmanager
def _empty_lists_unremarked():
    """torch's serializer warns on every empty list (a higher-order operator's additional inputs,
    most often) that it writes it as a tensor list: what the compiler reads it as."""
    logger, remark = logging.getLogger("torch._export.serde.serialize"), _EmptyListRemark()
    logger.addFilter(remark)
    try:
        yield
    finally:
        logger.removeFilter(remark)


def _collapsed(a, start, end):
    return aten.flatten.using_ints(a, start, end - 1) if end > start else aten.unsqueeze.default(a, start)


# prims' view ops as the ATen views they are: aot_autograd's functionalization refuses ops
# outside ATen whose result aliases an input.
_PRIM_VIEWS = {
    prims.view_of.default: lambda a: aten.alias.default(a),
    prims.squeeze.default: lambda a, dims: aten.squeeze.dims(a, dims),
    prims.split_dim.default: lambda a, dim, outer: aten.unflatten.int(a, dim, [outer, -1]),
    prims.collapse_view.default: _collapsed,
}


def prim_views_as_aten(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """`gm` with each call of a prims view op (`_PRIM_VIEWS`) replaced by the ATen ops it
    stands for (in place)."""
    replaced = False
    for node in list(gm.graph.nodes):
        rewrite = _PRIM_VIEWS.get(call_target(node))
        if rewrite is None:
            continue
        with gm.graph.inserting_before(node):
            new = _traced_call(gm.graph, rewrite, node.args, node.kwargs)
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        replaced = True
    if replaced:
        gm.graph.lint()
        gm.recompile()
    return gm


def _traced_call(graph: torch.fx.Graph, rewrite, args, kwargs) -> torch.fx.Node:
    """The node(s) `rewrite` makes of `args` in `graph`: it is called with proxies."""
    tracer = torch.fx.proxy.GraphAppendingTracer(graph)
    wrap = lambda a: torch.fx.Proxy(a, tracer) if isinstance(a, torch.fx.Node) else a  # noqa: E731
    result = rewrite(*[wrap(a) for a in args], **{k: wrap(v) for k, v in kwargs.items()})
    return result.node
