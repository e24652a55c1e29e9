"""Functional custom ops (`torch.library.custom_op`) in the graphs the backend compiles: tpuc
traces an op's Python implementation into ATen ops, which it lowers, keeping the op's name in
the nodes' locations. An implementation that cannot be traced (it reads tensor values on the
host, say) leaves the op as it is: refused in strict mode with the reason, run in eager torch
otherwise. A few ops whose implementation is not traceable but whose meaning is plain have an
equivalent in ATen ops here (`EQUIVALENTS`).
"""
from __future__ import annotations

import operator

import torch
from torch._library import custom_ops

from .graph import CUSTOM_OP, call_target

# Why an op's implementation could not be traced, by op name: reported with strict mode's
# refusal.
UNTRACEABLE: dict[str, str] = {}

# Namespaces whose ops are torch's own (decomposed or lowered by tpuc directly).
_TORCH_NAMESPACES = {"aten", "prims", "quantized_decomposed", "_c10d_functional", "c10d_functional",
                     "_dtensor", "higher_order"}


def grouped_rows_mm(input, weight, offs):
    """Rows of `input` [S, K] in group g (from the previous group's end offset to offs[g])
    times weight[g] [K, N]; rows past the last offset are zero. As dense ATen ops: every
    group's product, the rows outside it masked (what `aten._grouped_mm` computes for a 2-d by
    3-d product, without its alignment rules)."""
    ends = offs.to(torch.int64)
    starts = torch.cat([ends.new_zeros(1), ends[:-1]])
    position = torch.arange(input.shape[0], device=input.device).unsqueeze(1)
    mask = (position >= starts) & (position < ends)
    products = torch.einsum("sk,gkn->sgn", input, weight)
    return (products * mask.unsqueeze(-1).to(products.dtype)).sum(1)


def grouped_rows_mm_backward(input, weight, offs, grad_output):
    """The gradients of `grouped_rows_mm` with respect to its input and weight."""
    ends = offs.to(torch.int64)
    starts = torch.cat([ends.new_zeros(1), ends[:-1]])
    position = torch.arange(input.shape[0], device=input.device).unsqueeze(1)
    mask = ((position >= starts) & (position < ends)).to(grad_output.dtype)  # [S, G]
    grad_input = torch.einsum("sn,gkn,sg->sk", grad_output, weight, mask)
    grad_weight = torch.einsum("sk,sn,sg->gkn", input, grad_output, mask)
    return grad_input, grad_weight


# Custom ops (by qualified name) whose implementation loops over tensor values on the host,
# and the ATen computation that means the same: transformers' grouped matrix product of
# mixture-of-experts layers (the path it takes for float32 weights under torch.compile).
EQUIVALENTS = {
    "transformers::grouped_mm_fallback": grouped_rows_mm,
    "transformers::grouped_mm_fallback_backward": grouped_rows_mm_backward,
}


def decompositions(lowered) -> dict:
    """The `EQUIVALENTS` of the registered custom ops tpuc does not lower (`op in lowered`), as
    decompositions: for calls aot_autograd meets while tracing (a custom op's backward formula
    calling another) rather than in Dynamo's graph, where `inline` replaces them first."""
    table = {}
    for qualname, equivalent in EQUIVALENTS.items():
        opdef = custom_ops.OPDEFS.get(qualname)
        if opdef is not None and str(opdef._opoverload) not in lowered:
            table[opdef._opoverload] = equivalent
    return table


def inline(gm: torch.fx.GraphModule, lowered) -> torch.fx.GraphModule:
    """Dynamo's graph `gm` with each call of a registered functional custom op that tpuc does
    not lower replaced by the ATen ops of its implementation (or its `EQUIVALENTS` entry),
    traced on the call's example values, before aot_autograd: it functionalizes them and
    differentiates them like the rest. The new nodes carry the op's name (`graph.CUSTOM_OP`) and the
    call's source line. A call whose implementation cannot be traced stays, the reason kept in
    `UNTRACEABLE`. Changes `gm` in place."""
    changed = False
    for node in list(gm.graph.nodes):
        op = call_target(node)
        if op is None or op.namespace in _TORCH_NAMESPACES or str(op) in lowered or op._schema.is_mutable:
            continue
        qualname = op._schema.name
        opdef = custom_ops.OPDEFS.get(qualname)
        if opdef is None:
            continue
        implementation = EQUIVALENTS.get(qualname) or opdef._backend_fns.get("cpu") or opdef._init_fn
        try:
            traced = _trace(implementation, node)
            _check_splice(node, traced)
        except Exception as e:  # noqa: BLE001  (any failure: the op stays whole)
            first = str(e).splitlines()[0] if str(e) else ""
            UNTRACEABLE[str(op)] = f"its implementation cannot be traced into ATen ops: {type(e).__name__}: {first}"
            continue
        _splice(gm.graph, node, traced, qualname.split("::")[-1])
        changed = True
    if changed:
        gm.graph.lint()
        gm.recompile()
    return gm


def _example(value):
    if isinstance(value, torch.fx.Node):
        return value.meta.get("example_value", value.meta.get("val"))
    return value


def _trace(implementation, node: torch.fx.Node) -> torch.fx.GraphModule:
    """The implementation traced into ATen ops on the call's example (fake) values."""
    from torch._guards import detect_fake_mode
    from torch.fx.experimental.proxy_tensor import make_fx

    args = torch.utils._pytree.tree_map(_example, (node.args, node.kwargs))
    fake_mode = detect_fake_mode(torch.utils._pytree.tree_leaves(args))
    if fake_mode is None:
        raise RuntimeError("the call has no example values")
    flat, spec = torch.utils._pytree.tree_flatten(args)

    def call(*leaves):
        call_args, call_kwargs = torch.utils._pytree.tree_unflatten(list(leaves), spec)
        return implementation(*call_args, **call_kwargs)

    # "fake" tracing reuses the fake mode the example values belong to.
    return make_fx(call, tracing_mode="fake")(*flat)


def _check_splice(node: torch.fx.Node, traced: torch.fx.GraphModule) -> None:
    """Refuses what `_splice` cannot put in the graph: tensor constants in the traced
    implementation, results of several tensors used other than one by one."""
    if any(n.op == "get_attr" for n in traced.graph.nodes):
        raise RuntimeError("its implementation holds tensor constants")
    output = next(n for n in traced.graph.nodes if n.op == "output")
    if isinstance(output.args[0], (tuple, list)) and any(
            user.op != "call_function" or user.target is not operator.getitem for user in node.users):
        raise RuntimeError(f"{node.name}: its results are used as a whole")


def _splice(graph: torch.fx.Graph, node: torch.fx.Node, traced: torch.fx.GraphModule, name: str) -> None:
    """Puts `traced`'s nodes in place of `node` (its placeholders bound to the call's arguments,
    flattened as `_trace` took them), named and located after the call."""
    leaves = torch.utils._pytree.tree_leaves((node.args, node.kwargs))
    placeholders = [n for n in traced.graph.nodes if n.op == "placeholder"]
    values = dict(zip(placeholders, leaves))
    before = set(graph.nodes)
    with graph.inserting_before(node):
        result = graph.graph_copy(traced.graph, values)
    for new in [n for n in graph.nodes if n not in before]:
        new.meta.setdefault("custom", {})[CUSTOM_OP] = name
        if "stack_trace" in node.meta:
            new.meta["stack_trace"] = node.meta["stack_trace"]
        if "example_value" not in new.meta and "val" in new.meta:
            new.meta["example_value"] = new.meta["val"]
        new._rename(f"{name}_{new.name}")
    if isinstance(result, (tuple, list)):
        for user in list(node.users):
            user.replace_all_uses_with(result[user.args[1]])
            graph.erase_node(user)
    else:
        node.replace_all_uses_with(result)
    graph.erase_node(node)
