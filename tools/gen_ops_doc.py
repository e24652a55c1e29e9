#!/usr/bin/env python3
"""The coverage table of torch's core ATen opset: docs/ops.md, and the list `tpuc ops` prints.

For every `core`-tagged overload of the installed torch: whether tpuc lowers it, whether torch's
core-ATen decomposition table (plus tpuc's own additions) rewrites it into other ops (so the
torch.compile backend handles it through them), or neither. Non-core overloads tpuc lowers
follow. The dtypes column comes from docs/conformance.json when the OpInfo suite has run.

usage: .venv/bin/python tools/gen_ops_doc.py [--check]
  --check  exit 1 if the committed files differ from what torch and tpuc give now.
"""
import json
import os
import sys

import torch
from torch._decomp import core_aten_decompositions

import tpuc
from tpuc._tpuc import is_supported
from tpuc.decompositions import EXTRA

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "ops.md")
LIST = os.path.join(ROOT, "crates", "tpuc-hlo", "src", "lower", "core_aten_ops.txt")
CONFORMANCE = os.path.join(ROOT, "docs", "conformance.json")
TRACED = os.path.join(ROOT, "docs", "traced_ops.json")


def core_ops() -> list[str]:
    # Every aten op the dispatcher knows (dir(torch.ops.aten) lists only those looked up so far).
    names = sorted({n.split("::", 1)[1].split(".", 1)[0] for n in torch._C._dispatch_get_all_op_names()
                    if n.startswith("aten::")})
    ops = []
    for name in names:
        packet = getattr(torch.ops.aten, name, None)
        if not hasattr(packet, "overloads"):
            continue
        for overload in packet.overloads():
            op = getattr(packet, overload)
            if torch.Tag.core in op.tags:
                ops.append(str(op))
    return sorted(ops)


# Why each core overload tpuc does not lower stays that way; the script refuses an unsupported
# overload with no reason recorded here.
NOT_SUPPORTED_BECAUSE = {
    "aten.nonzero.default": "its output size depends on the data; XLA compiles static shapes "
                            "(use a mask, or torch.where with three arguments)",
    "aten._local_scalar_dense.default": "`.item()`: a Python number read from device data in the "
                                        "middle of a graph; Dynamo breaks the graph there",
    "aten.sym_numel.default": "a symbolic size; tpuc compiles static shapes, where it is a constant "
                              "folded away before tpuc sees the graph",
    "aten.sym_storage_offset.default": "a symbolic storage offset (see sym_numel)",
    "aten.resize_.default": "changes a tensor's size in place; functional graphs never contain it "
                            "(aot_autograd and torch.export remove it), and a device tensor keeps its "
                            "size (docs/eager.md)",
}


def tested_dtypes() -> dict[str, list[str]]:
    if not os.path.exists(CONFORMANCE):
        return {}
    with open(CONFORMANCE) as f:
        return json.load(f).get("passed_dtypes_by_op", {})


def traced_section(core: set, decomposed: set) -> list[str]:
    """docs/ops.md's section on the non-core ops that real models' graphs contain
    (docs/traced_ops.json, written by tools/trace_ops.py)."""
    if not os.path.exists(TRACED):
        return []
    with open(TRACED) as f:
        traced = json.load(f)
    rows = []
    for op, forms in sorted(traced["ops"].items()):
        if op in core:
            continue
        if is_supported(op):
            status = "lowered"
        elif op in decomposed and "export" not in forms:
            status = "decomposed"
        elif op in decomposed:
            status = "decomposed by the torch.compile backend; not supported in `tpuc compile`"
        else:
            status = "not supported"
        seen = "; ".join(f"{form}: {', '.join(names)}" for form, names in sorted(forms.items()))
        rows.append(f"| `{op}` | {status} | {seen} |")
    return [
        "",
        "## Non-core ops in real graphs",
        "",
        f"The ops outside the core set that {len(traced['models'])} models' graphs contain, traced by "
        f"`tools/trace_ops.py` (torch {traced['torch']}) in three forms: `export` (torch.export, undecomposed: "
        "what `tpuc compile` reads), `core` (after run_decompositions) and `training` (the forward and "
        "backward graphs aot_autograd gives the torch.compile backend for a training step). Models: "
        f"{', '.join(traced['models'])}.",
        "",
        "| op | status | where (form: models) |",
        "|---|---|---|",
        *rows,
    ]


def render() -> tuple[str, str]:
    core = core_ops()
    lowered = set(tpuc.supported_ops())
    decomposed = {str(op) for op in {**core_aten_decompositions(), **EXTRA}}
    dtypes = tested_dtypes()

    def status(op):
        if is_supported(op):
            return "lowered"
        if op in decomposed:
            return "decomposed"
        return "not supported"

    statuses = {op: status(op) for op in core}
    counts = {s: sum(1 for v in statuses.values() if v == s) for s in ("lowered", "decomposed", "not supported")}
    extra = sorted(lowered - set(core))
    lines = [
        "# Core ATen coverage",
        "",
        f"Generated by `tools/gen_ops_doc.py` from torch {torch.__version__.split('+')[0]} and tpuc's lowering "
        "registry; a test fails when it is stale.",
        "",
        f"{len(core)} core ATen overloads: {counts['lowered']} lowered, {counts['decomposed']} decomposed "
        f"(torch's core-ATen decompositions rewrite them into other ops, which the torch.compile backend "
        f"then lowers), {counts['not supported']} not supported. "
        f"tpuc also lowers {len(extra)} overloads outside the core set (listed below), "
        "as undecomposed `torch.export` graphs contain them.",
        "",
        "Status `lowered` means tpuc has a lowering; arguments it does not handle are refused with a "
        "clear error. The dtypes column lists the dtypes for which PyTorch's OpInfo samples pass "
        "(docs/conformance.md), where that suite has run.",
        "",
        "Complex numbers (complex64, complex128) flow through FFTs, arithmetic, conversions, "
        "reductions by sum/mean/prod and data movement, whose lowerings declare that they handle "
        "them; any other op given a complex tensor is refused (`not supported: <op> on complex "
        "tensors`) rather than computed as if the numbers were real. complex32 is not supported "
        "(XLA has no such type).",
        "",
        "| op | status | dtypes tested |",
        "|---|---|---|",
    ]
    for op in core:
        lines.append(f"| `{op}` | {statuses[op]} | {', '.join(dtypes.get(op, [])) or '-'} |")
    unsupported = [op for op in core if statuses[op] == "not supported"]
    missing = [op for op in unsupported if op not in NOT_SUPPORTED_BECAUSE]
    if missing:
        sys.exit(f"no reason recorded in NOT_SUPPORTED_BECAUSE for: {', '.join(missing)}")
    if unsupported:
        lines += ["", "## Not supported, and why", ""]
        lines += [f"- `{op}`: {NOT_SUPPORTED_BECAUSE[op]}." for op in unsupported]
    lines += traced_section(set(core), decomposed)
    lines += ["", "## Lowered overloads outside the core set", ""]
    lines += [f"- `{op}`" for op in extra]
    doc = "\n".join(lines) + "\n"
    listing = "".join(f"{op}\t{statuses[op]}\n" for op in core)
    return doc, listing


def main():
    doc, listing = render()
    check = "--check" in sys.argv[1:]
    stale = []
    for path, text in ((DOC, doc), (LIST, listing)):
        current = open(path).read() if os.path.exists(path) else None
        if current != text:
            stale.append(os.path.relpath(path, ROOT))
            if not check:
                with open(path, "w") as f:
                    f.write(text)
    if check and stale:
        sys.exit(f"stale: {', '.join(stale)}; run .venv/bin/python tools/gen_ops_doc.py")
    if not check:
        print("wrote" if stale else "unchanged:", " ".join(stale) or "docs/ops.md, core_aten_ops.txt")


if __name__ == "__main__":
    main()
