"""`tpuc.doctor`: a model examined before it runs on a plugin's devices (docs/doctor.md).

Dynamo captures the model as torch.compile(backend="tpuc") would, aot_autograd hands over its
graphs (a forward and a backward with ``training=True``), and each graph is lowered and compiled
by the plugin without running on its devices: the report of each is `tpuc doctor`'s. The
model's Python runs once on the host with the example inputs, as Dynamo needs it to (and
``torch._dynamo.explain`` runs it once more to name the graph breaks).
"""
from __future__ import annotations

import functools
import json
import math
from collections import Counter

import torch
from torch._functorch.aot_autograd import make_boxed_func

from . import _tpuc
from .backend import graphs_through
from .compiler import GraphCompiler
from .graph import op_name, source_line, unsupported_ops
from .options import Options

# Optimizer state per parameter element, in the parameter's dtype: AdamW's two moments; SGD's
# momentum buffer (none without momentum).
OPTIMIZER_STATE = {"adamw": 2, "adam": 2, "sgd": 1, "sgd-no-momentum": 0}


class DoctorReport:
    """What `tpuc.doctor` found: ``graphs``, one report per graph tpuc compiles (the JSON
    `tpuc doctor --json` prints, as dicts), ``unlowered`` (ops with no lowering: op, node,
    source), ``graph_breaks`` (each Dynamo break: reason, source) and their ``break_reasons``
    counted, ``training`` (each device's parameters, gradients and optimizer state, bytes),
    ``projection`` (with ``target``: the model's step on that accelerator, from one chip to
    thousands), ``problems`` and ``healthy``; ``str(report)`` reads as text, ``report.json()``
    as JSON."""

    def __init__(self, graphs, texts, unlowered, graph_breaks, training, projection=None):
        self.graphs = graphs
        self._texts = texts
        self.unlowered = unlowered
        self.graph_breaks = graph_breaks
        self.break_reasons = Counter(b["reason"] for b in graph_breaks)
        self.training = training
        self.projection, self._projection_text = projection or (None, None)
        self.problems = [p for g in graphs for p in g["problems"]]
        if unlowered:
            ops = sorted({u["op"] for u in unlowered})
            self.problems.append(f"{len(unlowered)} node(s) have no lowering: {', '.join(ops)}")
        if self.projection is not None and self.projection["problem"]:
            self.problems.append(self.projection["problem"])

    @property
    def healthy(self) -> bool:
        """Everything lowers and fits (graph breaks allowed: see `strict_healthy`)."""
        return not self.problems

    @property
    def strict_healthy(self) -> bool:
        """Healthy, and Dynamo captured the model whole (no graph break)."""
        return self.healthy and not self.graph_breaks

    def json(self) -> str:
        return json.dumps({"schema": 1, "graphs": self.graphs, "unlowered": self.unlowered,
                           "graph_breaks": self.graph_breaks, "training": self.training,
                           "projection": self.projection, "problems": self.problems}, indent=2)

    def html(self, path) -> None:
        """Writes the report as one self-contained HTML page (`tpuc doctor --html`'s, with the
        graph breaks, the training state and each graph's report)."""
        with open(path, "w", encoding="utf-8") as page:
            page.write(_tpuc.doctor_page("tpuc.doctor", self.json()))

    def __str__(self) -> str:
        lines = [f"tpuc.doctor: {len(self.graphs)} graph(s), {len(self.graph_breaks)} graph break(s)"]
        for reason, count in self.break_reasons.most_common():
            sources = sorted({b["source"] for b in self.graph_breaks if b["reason"] == reason and b["source"]})
            lines.append(f"  break x{count}: {reason}" + (f" (at {', '.join(sources)})" if sources else ""))
        for u in self.unlowered:
            at = f" at {u['source']}" if u["source"] else ""
            lines.append(f"  no lowering: {u['op']} (node {u['node']}){at}")
        if self.training is not None:
            t = self.training
            lines.append(f"training ({t['optimizer']}), each device: parameters {_bytes(t['parameters'])}, "
                         f"gradients {_bytes(t['gradients'])}, optimizer state {_bytes(t['optimizer_state'])}; "
                         f"activations the forward keeps for the backward {_bytes(t['saved_activations'])} "
                         "(the whole batch)")
        for text in self._texts:
            lines.append("")
            lines.append(text)
        if self._projection_text:
            lines.append("")
            lines.append("the model's step, its graphs together, " + self._projection_text)
        return "\n".join(lines)

    __repr__ = __str__


def _bytes(n: int) -> str:
    return _tpuc.human_bytes(int(n))


def doctor(model, *example_args, mesh=None, plan=None, training: bool = False, optimizer: str = "adamw",
           device_memory: int | None = None, plugin: str | None = None, fusion: str | None = None,
           matmul_precision: str = "highest", target: str | None = None, **example_kwargs) -> DoctorReport:
    """Examines `model` called on the example inputs as torch.compile(backend="tpuc") would run it
    (over `mesh` laid out by `plan`), compiling each graph without running it on a device; with
    `training`, the backward too (the outputs summed as the loss) and each device's parameters,
    gradients and `optimizer` state ("adamw", "adam", "sgd" with momentum, "sgd-no-momentum").
    `device_memory`: each device's bytes; a graph needing more is a problem. `target`: an
    accelerator to project the model's step onto ("v5e", "v6e", "v7x", "h100x8"; docs/doctor.md),
    its graphs summed."""
    if optimizer not in OPTIMIZER_STATE:
        raise ValueError(f"optimizer must be one of {sorted(OPTIMIZER_STATE)}, not {optimizer!r}")
    if target is not None:
        target = _tpuc.target_name(target)
    options = {"mesh": mesh, "plan": plan, "plugin": plugin, "matmul_precision": matmul_precision,
               "cache_dir": "off", "hoist_weights": False}
    if fusion is not None:
        options["fusion"] = fusion
    opts = Options.parse(options)
    found = _Found(device_memory, OPTIMIZER_STATE[optimizer] if training else None, optimizer)
    torch._dynamo.reset()
    try:
        explained = torch._dynamo.explain(model)(*example_args, **example_kwargs)
        breaks = [{"reason": str(r.reason).strip(), "source": _frame(r.user_stack)}
                  for r in explained.break_reasons]
        torch._dynamo.reset()
        backend = functools.partial(_examined, opts=opts, found=found)
        compiled = torch.compile(model, backend=backend, dynamic=False)
        grads = [(p, p.grad) for p in model.parameters()] if isinstance(model, torch.nn.Module) else []
        with torch.set_grad_enabled(training):
            out = compiled(*example_args, **example_kwargs)
            if training:
                _loss(out).backward()
        for p, grad in grads:
            p.grad = grad
    finally:
        torch._dynamo.reset()
    projection = None
    if target is not None:
        workload = _workload(found, model, training)
        if workload is not None:
            projected, text = _tpuc.project(json.dumps(workload), target)
            projection = (json.loads(projected), text)
    return DoctorReport(found.graphs, found.texts, found.unlowered, breaks, found.training, projection)


def _workload(found: _Found, model, training: bool) -> dict | None:
    """The model's step as one workload: its graphs' FLOPs, bytes and collectives summed, the
    model's own parameters (their gradients and optimizer state when training) and buffers.
    The activations: the most a forward or inference graph needs besides its arguments, or the
    saved activations and the temporaries of a backward (whose gradients are state)."""
    graphs = [g for g in found.graphs if g.get("workload")]
    if not graphs:
        return None
    loads = [g["workload"] for g in graphs]
    parameters = list(model.parameters()) if isinstance(model, torch.nn.Module) else []
    buffers = list(model.buffers()) if isinstance(model, torch.nn.Module) else []
    sizes = [p.numel() * p.element_size() for p in parameters]
    trained = sum(n for n, p in zip(sizes, parameters) if p.requires_grad) if training else 0
    by_dtype = Counter()
    for n, p in zip(sizes, parameters):
        by_dtype[str(p.dtype).removeprefix("torch.")] += n
    memory = [g["compiled"]["memory"] for g in graphs]
    per_device = 0
    if found.training is not None:
        per_device = found.training["gradients"] + found.training["optimizer_state"]
    return {
        "product_flops": sum(w["product_flops"] for w in loads),
        "flops": sum(w["flops"] for w in loads),
        "bytes": sum(w["bytes"] for w in loads),
        "dtype": by_dtype.most_common(1)[0][0] if by_dtype else loads[0]["dtype"],
        "precision": loads[0]["precision"],
        "parameters": sum(sizes),
        "gradients": trained,
        "optimizer_state": trained * (found.state_per_element or 0),
        "replicated": sum(b.numel() * b.element_size() for b in buffers),
        "largest_parameter": max(sizes, default=0),
        "activations": max(_activations(g, found.training) for g in graphs),
        "devices": loads[0]["devices"],
        "device_memory": max(m["total"] for m in memory) + per_device,
        "collectives": [c for w in loads for c in w["collectives"]],
    }


def _activations(graph: dict, training: dict | None) -> int:
    """What a graph holds at its peak besides the model's state (see `_workload`)."""
    memory = graph["compiled"]["memory"]
    if graph["program"].startswith("backward") and training is not None:
        return training["saved_activations"] + memory["temporaries"]
    return memory["total"] - memory["arguments"]


def _frame(stack) -> str | None:
    if not stack:
        return None
    frame = stack[-1]
    return f"{frame.filename}:{frame.lineno}"


def _loss(out) -> torch.Tensor:
    leaves = [t for t in torch.utils._pytree.tree_leaves(out)
              if isinstance(t, torch.Tensor) and t.requires_grad and t.is_floating_point()]
    if not leaves:
        raise _tpuc.TpucError("tpuc.doctor(training=True): the model's outputs need no gradient")
    return sum(t.float().sum() for t in leaves)


class _Found:
    """What the examination of each graph found."""

    def __init__(self, device_memory, state_per_element, optimizer):
        self.device_memory = device_memory
        self.state_per_element = state_per_element
        self.optimizer = optimizer
        self.graphs: list[dict] = []
        self.texts: list[str] = []
        self.unlowered: list[dict] = []
        self.training: dict | None = None


def _examined(gm, example_inputs, opts: Options, found: _Found):
    compiler = functools.partial(_Examiner, found=found)
    return graphs_through(compiler, gm, example_inputs, opts)


class _Examiner(GraphCompiler):
    """A GraphCompiler that examines each graph instead of compiling it to run, and runs it in
    eager torch on the host so that Dynamo and aot_autograd go on."""

    def __init__(self, opts, specs, batch, checked, found: _Found):
        super().__init__(opts, specs, batch, checked)
        self.found = found

    def forward(self, gm, example_inputs):
        if self.found.state_per_element is not None:
            state = self._training_state(gm, example_inputs)
            if self.found.training is None:
                self.found.training = state
            else:  # another graph's parameters (a graph break): the model's state is the sum
                for key, value in state.items():
                    if key != "optimizer":
                        self.found.training[key] += value
        super().forward(gm, example_inputs)
        return make_boxed_func(gm.forward)

    def backward(self, gm, example_inputs):
        super().backward(gm, example_inputs)
        return make_boxed_func(gm.forward)

    def inference(self, gm, example_inputs):
        super().inference(gm, example_inputs)
        return make_boxed_func(gm.forward)

    def compile_ahead(self, gm, kind):
        pass

    def compile(self, gm, kind, weights=None, layouts=None):
        name = f"{kind}_{len(self.found.graphs) + 1}"
        missing = unsupported_ops(gm, self.supported)
        if missing:
            for node in gm.graph.nodes:
                if node.op == "call_function" and op_name(node) in missing:
                    self.found.unlowered.append({"op": op_name(node), "node": node.name,
                                                 "source": source_line(node)})
            return None
        prepared = self.prepare(gm, name, weights, layouts)
        report, text = self.session.runtime.examine(prepared.program, name, self.opts.compile,
                                                    device_memory=self.found.device_memory,
                                                    **self.request(prepared, None, None))
        self.found.graphs.append(json.loads(report))
        self.found.texts.append(text)
        return None

    def _training_state(self, gm, example_inputs) -> dict:
        """Each device's parameters (the forward's static inputs that need a gradient), their gradients
        (laid out as they are) and the optimizer's state, in bytes."""
        specs = self.primal_specs(gm) or [None] * len(example_inputs)
        sizes = dict(zip(self.opts.mesh.axis_names, self.opts.mesh.shape)) if self.opts.mesh is not None else {}
        # aot_autograd's inputs carry no requires_grad of their own; its metadata says which do.
        context = torch._guards.TracingContext.try_get()
        metadata = getattr(context, "fw_metadata", None)
        info = getattr(metadata, "input_info", None) or []
        needs_grad = [getattr(i, "requires_grad", False) for i in info]
        # The model's parameters are static inputs (Dynamo marks them); an activation a graph
        # break hands on needs a gradient too but is not one.
        static = getattr(metadata, "static_input_indices", None)
        parameters = 0
        for i, (value, spec) in enumerate(zip(example_inputs, specs)):
            wanted = needs_grad[i] if i < len(needs_grad) else getattr(value, "requires_grad", False)
            if isinstance(value, torch.Tensor) and wanted and (static is None or i in static):
                parameters += value.numel() * value.element_size() // _split(spec, sizes)
        return {"optimizer": self.found.optimizer, "parameters": parameters, "gradients": parameters,
                "optimizer_state": parameters * self.found.state_per_element,
                "saved_activations": _saved_bytes(gm, getattr(metadata, "num_forward", None))}


def _saved_bytes(gm, returned) -> int:
    """The bytes of what the forward graph keeps for the backward: its outputs after the
    `returned` ones the caller gets (aot_autograd's partition), less those that are an input seen
    through views (a weight kept transposed). The whole batch's, one graph's."""
    (output,) = [n for n in gm.graph.nodes if n.op == "output"]
    results = output.args[0]
    if returned is None or not isinstance(results, (list, tuple)):
        return 0
    kept = [n for n in results[returned:] if isinstance(n, torch.fx.Node) and not _views_an_input(n)]
    values = [n.meta.get("val") for n in kept]
    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


def _views_an_input(node: torch.fx.Node) -> bool:
    """Whether a node is an input seen through views (a transposed weight): its memory is the
    input's, not an activation's."""
    while node.op == "call_function" and getattr(node.target, "is_view", False) and node.args:
        if not isinstance(node.args[0], torch.fx.Node):
            return False
        node = node.args[0]
    return node.op == "placeholder"


def _split(spec, sizes: dict) -> int:
    """Into how many parts a layout splits a tensor: the product of the mesh axes it names."""
    if spec is None:
        return 1
    names = []
    for dim in spec:
        if dim is None:
            continue
        names.extend([dim] if isinstance(dim, str) else list(dim))
    return math.prod(sizes.get(n, 1) for n in names) or 1
