"""Fused mode's programs (the native layer records the runs: native/fusion.h): a recorded run's
ops' graphs joined into one graph, compiled as one program. The native layer caches it by the
run's structure (its ops, where each input comes from, the values it returns), so the same steps
of a loop run one program without entering Python."""
from __future__ import annotations

import time

import torch

from . import op_tracing, plan_store, planner


def fuse(ops: list, returned: list, device: int):
    """The program of a run of recorded ops: `ops` holds each op's graph number (its entry's,
    `planner.graph_of`) and where each of its inputs comes from (an earlier output by its
    number, or the run's input `-1 - s`); the program returns the outputs numbered `returned`.
    None when tpuc cannot compile them as one (the ops then run one by one, as compiled alone)."""
    started = time.perf_counter()
    planner.STATS["fused_runs_planned"] += 1
    try:
        return planner.on_planning_thread(_fused_program, ops, returned, device)
    finally:
        planner.STATS["plan_seconds"] += time.perf_counter() - started


def _fused_program(ops: list, returned: list, device: int):
    # A run of ops whose plans are on disk has its program kept there too, by the run's
    # structure: a second process finds it without joining and lowering the ops again.
    names = [planner.stored_as(g) for g, _ in ops]
    stored = None
    if None not in names:
        structure = repr((names, [list(sources) for _, sources in ops], list(returned))).encode()
        # The compiler's options (the fusion stage, say) shape the program too.
        settings = f"{op_tracing.compiler().opts!r} device {device}"
        stored = plan_store.key("fused", "", structure, b"", settings)
        record = plan_store.load(stored)
        if record is not None:
            planner.STATS["fused_runs_from_disk"] += 1
            return planner.load_stored_program(record)
    inputs = max((-s for _, sources in ops for s in sources if s < 0), default=0)
    gm = joined_graph([(planner.graph_of(g), sources, None) for g, sources in ops], inputs, returned)
    name = f"fused_{len(ops)}_ops"
    try:
        program, prepared, _ = planner.compile_graph(gm, name, device)
    except Exception as error:  # noqa: BLE001 - only what `cannot_run` recognises is handled
        if op_tracing.cannot_run(error) is None:
            raise
        return None
    if stored is not None:
        plan_store.store(stored, planner.program_record(name, device, prepared))
    return program


def joined_graph(ops: list, inputs: int, returned: list) -> torch.fx.GraphModule:
    """Graphs of ops run one after the other as one graph: `ops` holds each op's graph, where each
    of its placeholders comes from (an earlier op's output by its number, >= 0, or input
    `-1 - s` of the `inputs` the joined graph takes) and which of its outputs are numbered (None:
    all of them, in order); the outputs numbered `returned` are the joined graph's."""
    graph = torch.fx.Graph()
    root = torch.nn.Module()
    # Each input's type, from the first op that reads it.
    types: list = [None] * inputs
    for gm, sources, _ in ops:
        for node, source in zip(_placeholders(gm), sources):
            if source < 0 and types[-1 - source] is None:
                types[-1 - source] = node.meta["val"]
    placeholders = []
    for position, value in enumerate(types):
        node = graph.placeholder(f"input_{position}")
        node.meta["val"] = value
        placeholders.append(node)
    computed: list = []
    for number, (gm, sources, numbered) in enumerate(ops):
        env = {node: placeholders[-1 - source] if source < 0 else computed[source]
               for node, source in zip(_placeholders(gm), sources)}
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                continue
            if node.op == "output":
                values = node.args[0] if isinstance(node.args[0], (tuple, list)) else [node.args[0]]
                computed.extend(env[value] for k, value in enumerate(values) if numbered is None or numbered[k])
            elif node.op == "get_attr":
                name = f"constant_{number}_{node.target}"
                setattr(root, name, getattr(gm, node.target))
                env[node] = graph.get_attr(name)
                env[node].meta = dict(node.meta)
            else:
                env[node] = graph.node_copy(node, lambda n, env=env: env[n])
    graph.output(tuple(computed[i] for i in returned))
    joined = torch.fx.GraphModule(root, graph)
    joined.graph.eliminate_dead_code()
    joined.recompile()
    return joined


def _placeholders(gm: torch.fx.GraphModule) -> list:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]
