"""`tpuc doctor` examines a program without running it. Each figure it gives is checked against
what running the same program does: the collectives XLA's optimized program holds (dumped by
XLA while `tpuc run` runs it), the weights each device holds when it runs, and the products'
FLOPs in tpuc's IR against those in XLA's optimized program. Bad programs: an op that does not
lower, a size tensor values decide, an archive that does not parse, a device too small."""

import glob
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from models import zoo
from torch.utils._pytree import tree_leaves

TPUC = os.path.join(os.path.dirname(sys.executable), "tpuc")
MODELS = {name: (model, inputs) for name, model, inputs in zoo()}
KINDS = ["all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute"]
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def export(name, tmp_path):
    model, inputs = MODELS[name]
    archive = tmp_path / f"{name}.pt2"
    torch.export.save(torch.export.export(model, inputs), str(archive))
    np.savez(tmp_path / "inputs.npz", *[t.numpy() for t in tree_leaves(inputs)])
    return archive


def doctor(archive, *flags, cwd=None, xla_flags=None):
    """Exit status, the JSON report (None when there is none) and standard error."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    if xla_flags:
        env["XLA_FLAGS"] = xla_flags
    run = subprocess.run([TPUC, "doctor", str(archive), "--json", *flags], capture_output=True, text=True,
                         timeout=120, cwd=cwd, env=env)
    report = json.loads(run.stdout) if run.stdout.strip().startswith("{") else None
    return run.returncode, report, run.stderr


def collectives_when_run(archive, flags, tmp_path):
    """Run the program with XLA dumping its optimized programs: the collectives of each kind
    they hold, and what `tpuc run` says each device holds of the weights (bytes)."""
    dump = tmp_path / "dump"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", XLA_FLAGS=f"--xla_dump_to={dump} --xla_dump_hlo_as_text")
    run = subprocess.run([TPUC, "run", str(archive), "-i", str(tmp_path / "inputs.npz"), "--out",
                          str(tmp_path / "out"), "--cache-dir", "off", "--no-hoist", *flags],
                         capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stderr
    (module,) = [p for p in glob.glob(str(dump / "*after_optimizations.txt")) if "main" in os.path.basename(p)]
    lines = [line for line in open(module).read().splitlines() if " = " in line]
    counts = {k: sum(f" {k}(" in line or f" {k}-start(" in line for line in lines) for k in KINDS}
    amount, unit = re.search(r"\(([\d.]+) (B|KiB|MiB|GiB) per device", run.stderr).groups()
    return {k: n for k, n in counts.items() if n}, float(amount) * UNITS[unit]


# Every zoo model under every plan.
LAYOUTS = [(None, None), ("dp=2", "dp"), ("fsdp=2", "fsdp"), ("tp=2", "tp"), ("fsdp=2,tp=2", "fsdp,tp")]
CASES = [pytest.param(name, mesh, plan, id=f"{name}-{mesh or 'one'}") for name in MODELS for mesh, plan in LAYOUTS]


@pytest.mark.parametrize("name,mesh,plan", CASES)
def test_the_report_matches_what_running_the_program_does(name, mesh, plan, tmp_path):
    archive = export(name, tmp_path)
    flags = ["--mesh", mesh, "--plan", plan] if mesh else []
    status, report, stderr = doctor(archive, *flags, "--target", "v5e")
    assert status == 0 and report["problems"] == [], stderr
    devices = report["devices"]
    assert devices == (int(np.prod([int(a.split("=")[1]) for a in mesh.split(",")])) if mesh else 1)
    assert report["coverage"]["failures"] == [] and report["weights"]["count"] > 0
    compiled = report["compiled"]
    # The products' FLOPs: all of them on one device; under a plan, each device's share. XLA
    # rewrites a convolution over a tiny image to skip the taps on its zero padding, which the
    # IR counts (as FLOP counts conventionally do): there XLA's count is lower.
    cost = compiled["cost"]
    share = cost["xla_product_flops"] / cost["product_flops"]
    assert share <= 1.0 + 1e-9
    if name != "resnet18":
        assert share == 1.0 if devices == 1 else share >= 1 / devices - 1e-9
    assert cost["flops"] >= cost["product_flops"] > 0 and cost["bytes"] > 0
    # The collectives: those XLA's program holds when it runs.
    counted, weights_per_device = collectives_when_run(archive, flags, tmp_path)
    assert {c["kind"]: c["count"] for c in compiled["collectives"]} == counted
    # Each device's arguments: the weights it holds when running (as `tpuc run` counts its
    # buffers, to its printed precision), and its part of the inputs.
    memory = compiled["memory"]
    inputs = sum(a.nbytes for a in np.load(tmp_path / "inputs.npz").values())
    assert weights_per_device * 0.99 <= memory["arguments"] <= weights_per_device * 1.01 + inputs + 16
    assert memory["total"] == memory["arguments"] + memory["outputs"] + memory["temporaries"] - memory["aliased"]
    # The projection takes the same program: its memory, its collectives, each device's share.
    examined = report["projection"]["as_examined"]
    assert examined["chips"] == devices and examined["memory"] == memory["total"]
    assert [c["kind"] for c in examined["collectives"]] == [c["kind"] for c in compiled["collectives"]]
    assert report["workload"]["product_flops"] == pytest.approx(cost["product_flops"] / devices)


@pytest.mark.parametrize("name,mesh,plan", [("llama", None, None), ("resnet18", None, None),
                                            ("mingpt", "fsdp=2", "fsdp")])
def test_flops_and_bytes_agree_with_xla_cost_analysis_of_the_same_program(name, mesh, plan, tmp_path):
    """XLA's own cost analysis (HloCostAnalysis, through jaxlib) of the optimized program the
    plugin compiled for the report, dumped by XLA: the bytes the report reads off that program
    and the FLOPs it counts in tpuc's IR (per device) agree with it."""
    from jax._src.lib import xla_client
    from jaxlib import _hlo

    archive = export(name, tmp_path)
    dump = tmp_path / "dump"
    flags = ["--mesh", mesh, "--plan", plan] if mesh else []
    status, report, stderr = doctor(archive, *flags, xla_flags=f"--xla_dump_to={dump} --xla_dump_hlo_as_proto")
    assert status == 0, stderr
    (proto,) = [p for p in glob.glob(str(dump / "*after_optimizations.hlo.pb")) if "main" in os.path.basename(p)]
    module = _hlo.HloModule.from_serialized_hlo_module_proto(first_field(open(proto, "rb").read()))
    xla = xla_client._xla.hlo_module_cost_analysis(jax_cpu_client(), module)
    cost = report["compiled"]["cost"]
    assert cost["xla_bytes"] == pytest.approx(xla["bytes accessed"], rel=0.01), xla
    per_device = cost["flops"] / report["devices"]
    if name == "resnet18":
        # XLA's cost analysis leaves out the taps of a small image's convolutions that fall on
        # the padding, which tpuc counts (as FLOP counts conventionally do): its count is lower.
        assert per_device >= cost["xla_product_flops"] > xla["flops"] > 0.5 * per_device, xla
    else:
        assert 0.8 <= per_device / xla["flops"] <= 1.25, (per_device, xla)


def first_field(message: bytes) -> bytes:
    """Field 1 of a protobuf message that starts with it, length-delimited: the HloModuleProto
    of the HloProto XLA dumps."""
    assert message[0] == 0x0A, "the dump does not start with its module"
    length, shift, at = 0, 0, 1
    while True:
        byte = message[at]
        length |= (byte & 0x7F) << shift
        shift, at = shift + 7, at + 1
        if byte < 0x80:
            return message[at:at + length]


def jax_cpu_client():
    import jax

    return jax.devices("cpu")[0].client


def test_target_projects_the_program_onto_an_accelerator(tmp_path):
    """`--target`: the roofline of the examined program on the chip, from the report's own
    counts and the chip's published figures; dp and fsdp from one chip to 16384."""
    archive = export("llama", tmp_path)
    status, report, stderr = doctor(archive, "--mesh", "fsdp=2", "--plan", "fsdp", "--target", "TPU-v6e")
    assert status == 0 and report["problems"] == [], stderr
    p = report["projection"]
    assert p["target"]["name"] == "v6e" and p["dtype"] == "float32" and p["precision"] == "highest"
    assert p["peak_flops"] == pytest.approx(918e12 / 6)
    w, e = report["workload"], p["as_examined"]
    assert w["devices"] == 2 and w["product_flops"] == report["compiled"]["cost"]["product_flops"] / 2
    assert e["chips"] == 2 and e["memory"] == report["compiled"]["memory"]["total"] and e["fits"]
    assert e["compute_seconds"] == pytest.approx(w["product_flops"] / p["peak_flops"])
    assert e["memory_seconds"] == pytest.approx(report["compiled"]["cost"]["xla_bytes"] / 1640e9)
    # Each collective kind the program runs, at the link's bandwidth.
    assert {c["kind"] for c in e["collectives"]} == {c["kind"] for c in report["compiled"]["collectives"]}
    assert e["step_seconds"] == pytest.approx(max(e["compute_seconds"], e["memory_seconds"])
                                              + sum(c["seconds"] for c in e["collectives"]))
    chips = [r["chips"] for r in p["scaling"] if r["plan"] == "dp"]
    assert chips[0] == 1 and chips[-1] == 16384 and len(p["scaling"]) == 2 * len(chips)
    # Inference: data parallel needs no collective; fsdp gathers the weights, less per chip.
    dp = [r for r in p["scaling"] if r["plan"] == "dp"]
    fsdp = [r for r in p["scaling"] if r["plan"] == "fsdp"]
    assert all(r["collectives"] == [] and r["efficiency"] == 1.0 for r in dp)
    assert fsdp[4]["memory"] < dp[4]["memory"] and fsdp[4]["collectives"][0]["kind"] == "all-gather"
    # An unknown chip is named with those tpuc knows.
    status, _, stderr = doctor(archive, "--target", "v9z")
    assert status == 2 and "unknown target \"v9z\"" in stderr and "h100x8" in stderr
    run = subprocess.run([TPUC, "doctor", str(archive), "--target", "h100x8"], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    for line in ("on h100x8: NVIDIA H100", "not measurements", "as examined, 1 chip", "scaling", "fsdp"):
        assert line in run.stdout, run.stdout


def test_sharded_weights_are_named_as_the_collectives_that_gather_them(tmp_path):
    archive = export("llama", tmp_path)
    status, report, stderr = doctor(archive, "--mesh", "fsdp=2", "--plan", "fsdp")
    assert status == 0, stderr
    (gather,) = [c for c in report["compiled"]["collectives"] if c["kind"] == "all-gather"]
    named = {site["op"] for site in gather["sites"]}
    assert any(n.startswith("weight ") and n.endswith(".weight") for n in named), named
    # Those computed for an op carry the user's source line.
    sites = [s for c in report["compiled"]["collectives"] for s in c["sites"] if s["op"].startswith("aten.")]
    assert all(s["source"] and "models.py:" in s["source"] for s in sites), sites


def test_the_text_report_names_each_section_and_its_verdict(tmp_path):
    archive = export("llama", tmp_path)
    run = subprocess.run([TPUC, "doctor", str(archive), "--mesh", "tp=2", "--plan", "tp"], capture_output=True,
                         text=True, timeout=120, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    for section in ("program", "coverage", "memory per device", "collectives per step", "cost per step",
                    "verdict: ready to run"):
        assert section in run.stdout, run.stdout
    assert "every op lowers" in run.stdout and "all-reduce" in run.stdout


def test_a_device_too_small_fails_and_says_by_how_much(tmp_path):
    archive = export("llama", tmp_path)
    status, report, _ = doctor(archive, "--device-memory", "64KiB")
    assert status == 1
    (problem,) = report["problems"]
    assert "each device needs" in problem and "64.0 KiB" in problem
    status, _, _ = doctor(archive, "--device-memory", "1GiB")
    assert status == 0
    status, _, stderr = doctor(archive, "--device-memory", "lots")
    assert status == 2 and "expected a size such as 16GiB" in stderr


def test_a_dynamic_export_lists_its_sizes_and_the_executables_they_cost(tmp_path):
    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(16, 16)

        def forward(self, x):
            return self.linear(x).relu()

    batch = torch.export.Dim("batch", min=2, max=100)
    program = torch.export.export(Layer(), (torch.randn(8, 16),), dynamic_shapes={"x": {0: batch}})
    torch.export.save(program, tmp_path / "layer.pt2")
    status, report, stderr = doctor(tmp_path / "layer.pt2")
    assert status == 0, stderr
    (symbol,) = report["symbols"]
    assert (symbol["min"], symbol["max"], symbol["example"]) == (2, 100, 8)
    assert symbol["buckets"] == [16, 32, 64, 100]
    assert report["inputs"][0]["shape"] == [symbol["name"], "16"]
    _, listed, _ = doctor(tmp_path / "layer.pt2", "--buckets", "32,100")
    assert listed["symbols"][0]["buckets"] == [32, 100]
    _, every, _ = doctor(tmp_path / "layer.pt2", "--buckets", "off")
    assert every["symbols"][0]["buckets"] == list(range(2, 101))


def test_an_op_padding_cannot_keep_exact_makes_every_size_an_executable(tmp_path):
    """A sort along the dynamic size: padded rows would sort in among the real ones, so the
    program compiles per size; the report names the node and its line, counts an executable per
    size, and `--strict` fails on it."""
    class Sorted(torch.nn.Module):
        def forward(self, x):
            return torch.sort(x, dim=0).values * 2

    batch = torch.export.Dim("batch", min=2, max=40)
    program = torch.export.export(Sorted(), (torch.randn(8, 4),), dynamic_shapes={"x": {0: batch}})
    torch.export.save(program, tmp_path / "sorted.pt2")
    status, report, stderr = doctor(tmp_path / "sorted.pt2")
    assert status == 0, stderr
    why = report["coverage"]["per_size"]
    assert "aten.sort.default" in why and "test_doctor.py:" in why and "cannot be padded" in why
    assert report["symbols"][0]["buckets"] == list(range(2, 41))
    status, strict, _ = doctor(tmp_path / "sorted.pt2", "--strict")
    assert status == 1 and strict["problems"] == [f"compiles per size, not per bucket (--strict): {why}"]


def test_ops_that_do_not_lower_are_named_with_their_source_and_fail(tmp_path):
    @torch.library.custom_op("doctortest::twice", mutates_args=())
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @twice.register_fake
    def _(x):
        return torch.empty_like(x)

    class Model(torch.nn.Module):
        def forward(self, x):
            kept = torch.ops.aten.nonzero.default(x.relu())
            return twice(x).sum() + kept.float().sum()

    torch.export.save(torch.export.export(Model(), (torch.randn(4, 4),)), tmp_path / "model.pt2")
    status, report, _ = doctor(tmp_path / "model.pt2")
    assert status == 1 and report["compiled"] is None
    failures = report["coverage"]["failures"]
    assert failures and all(f["source"] and "test_doctor.py:" in f["source"] for f in failures), failures
    named = {f["op"] for f in failures}
    assert named & {"doctortest.twice.default", "aten.nonzero.default"}, failures


def test_an_archive_that_does_not_parse_is_a_clear_error(tmp_path):
    broken = tmp_path / "broken.pt2"
    broken.write_bytes(b"PK\x03\x04 not really an archive")
    run = subprocess.run([TPUC, "doctor", str(broken)], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert run.returncode == 2 and run.stdout == ""
    assert "cannot examine" in run.stderr and "broken.pt2" in run.stderr and "panicked" not in run.stderr
    missing = subprocess.run([TPUC, "doctor", str(tmp_path / "nowhere.pt2")], capture_output=True, text=True,
                             timeout=60)
    assert missing.returncode == 2 and "nowhere.pt2" in missing.stderr


class _Broken(torch.nn.Module):
    """Two graphs: Dynamo breaks where the model calls Python it does not trace."""

    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(8, 8)
        self.second = torch.nn.Linear(8, 4)

    def forward(self, x):
        y = self.first(x).relu()
        torch._dynamo.graph_break()
        return self.second(y)


def test_python_doctor_names_graph_breaks_and_examines_each_graph():
    import tpuc

    report = tpuc.doctor(_Broken(), torch.randn(2, 8))
    assert len(report.graphs) == 2 and report.healthy and not report.strict_healthy
    (only,) = report.graph_breaks
    assert only["source"] and "test_doctor.py:" in only["source"]
    assert sum(report.break_reasons.values()) == 1
    for graph in report.graphs:
        assert graph["compiled"] is not None and graph["compiled"]["cost"]["product_flops"] > 0
    text = str(report)
    assert "1 graph break(s)" in text and "verdict: ready to run" in text


def test_python_doctor_examines_training_with_its_optimizer_state():
    """The forward and the backward aot_autograd makes, each compiled without running on a
    device; the parameters' gradients and AdamW's state counted per device (halved where fsdp
    splits a weight over two); the model's own gradients left as they were."""
    import tpuc

    model, (tokens,) = MODELS["llama"]
    model = model.train()
    whole = sum(p.numel() * p.element_size() for p in model.parameters())
    before = [p.grad for p in model.parameters()]
    try:
        report = tpuc.doctor(model, tokens, training=True)
        kinds = sorted(g["program"].split("_")[0] for g in report.graphs)
        assert kinds == ["backward", "forward"] and report.healthy, report.problems
        state = dict(report.training)
        saved = state.pop("saved_activations")
        assert state == {"optimizer": "adamw", "parameters": whole, "gradients": whole,
                                   "optimizer_state": 2 * whole}
        # What the forward keeps for the backward, against what eager autograd saves beyond the
        # weights (their memory is the parameters').
        weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
        eager = []

        def pack(t):
            if t.untyped_storage().data_ptr() not in weights:
                eager.append(t.numel() * t.element_size())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(tokens).float().sum()
        assert 0.5 * sum(eager) <= saved <= 1.25 * sum(eager), (saved, sum(eager))
        assert "activations the forward keeps for the backward" in str(report)
        assert [p.grad for p in model.parameters()] == before
        sharded = tpuc.doctor(model, tokens, training=True, optimizer="sgd", mesh="fsdp=2", plan="fsdp")
        assert sharded.healthy, sharded.problems
        per_device = sharded.training["parameters"]
        assert whole / 2 <= per_device < whole and sharded.training["optimizer_state"] == per_device
        gathers = [c for g in sharded.graphs for c in g["compiled"]["collectives"] if c["kind"] == "all-gather"]
        assert gathers, sharded.graphs
    finally:
        model.eval()


def test_python_doctor_projects_training_onto_an_accelerator():
    """`target`: the model's forward and backward together on the chip; data parallel
    all-reduces the gradients, fsdp gathers the parameters twice and reduce-scatters them."""
    import tpuc

    model, (tokens,) = MODELS["mingpt"]
    model = model.train()
    whole = sum(p.numel() * p.element_size() for p in model.parameters())
    try:
        report = tpuc.doctor(model, tokens, training=True, target="v5e")
    finally:
        model.eval()
    assert report.healthy, report.problems
    p = report.projection
    assert p["target"]["name"] == "v5e"
    products = sum(g["compiled"]["cost"]["product_flops"] for g in report.graphs)
    assert p["as_examined"]["compute_seconds"] == pytest.approx(products / (197e12 / 6))
    dp8 = next(r for r in p["scaling"] if r["plan"] == "dp" and r["chips"] == 8)
    (reduce,) = dp8["collectives"]
    assert reduce["kind"] == "all-reduce" and reduce["bytes"] == whole
    fsdp8 = next(r for r in p["scaling"] if r["plan"] == "fsdp" and r["chips"] == 8)
    assert {c["kind"]: c["bytes"] for c in fsdp8["collectives"]} == {"all-gather": 2 * whole, "reduce-scatter": whole}
    assert fsdp8["memory"] < dp8["memory"]
    assert "the model's step, its graphs together, on v5e" in str(report)
    assert json.loads(report.json())["projection"]["target"]["name"] == "v5e"
    with pytest.raises(tpuc.TpucError, match="unknown target"):
        tpuc.doctor(model, tokens, target="a100")


def test_python_doctor_names_ops_without_a_lowering():
    import tpuc

    class Model(torch.nn.Module):
        def forward(self, x):
            return torch.linalg.matrix_exp(x.relu()).sum(0) + 1

    report = tpuc.doctor(Model(), torch.randn(3, 3))
    assert not report.healthy
    (missing,) = report.unlowered
    assert missing["op"] == "aten.linalg_matrix_exp.default" and "test_doctor.py:" in missing["source"]
    assert "no lowering: aten.linalg_matrix_exp.default" in str(report)
    with pytest.raises(ValueError, match="optimizer must be one of"):
        tpuc.doctor(Model(), torch.randn(3, 3), training=True, optimizer="lion")


def test_the_html_page_renders_in_a_browser_with_the_json_numbers(tmp_path):
    """`--html`: one self-contained page; rendered by headless Chromium (tools/setup.sh installs
    it), its numbers are the JSON report's: memory per device, each kind of collective, the op
    histogram, the products' FLOPs."""
    import shutil

    browser = shutil.which("chromium-headless-shell")
    assert browser, "chromium-headless-shell is missing: run tools/setup.sh"
    archive = export("llama", tmp_path)
    page = tmp_path / "report.html"
    status, report, stderr = doctor(archive, "--mesh", "fsdp=2", "--plan", "fsdp", "--device-memory", "16KiB",
                                    "--html", str(page))
    assert status == 1 and report["problems"], stderr
    assert "http" not in re.sub(r'http://www\.w3\.org/2000/svg', "", page.read_text())  # nothing fetched
    rendered = subprocess.run([browser, "--no-sandbox", "--disable-gpu", "--dump-dom", page.as_uri()],
                              capture_output=True, text=True, timeout=60)
    dom = rendered.stdout
    assert rendered.returncode == 0 and 'data-rendered="yes"' in dom, rendered.stderr[-2000:]
    compiled = report["compiled"]
    memory = compiled["memory"]
    for part in ("total", "arguments", "temporaries"):
        assert f'id="memory-{part}" data-bytes="{memory[part]}"' in dom
    assert dom.count('data-part="') == 4
    for kind in compiled["collectives"]:
        assert f'data-kind="{kind["kind"]}">{kind["count"]}<' in dom
        assert f'data-kind="{kind["kind"]}" data-bytes="{kind["bytes"]}"' in dom
    assert dom.count("<rect") >= len(compiled["sequence"]) + len(compiled["ops"]) + 4
    drawn = sorted(compiled["ops"].items(), key=lambda item: -item[1])[:30]
    for op, count in drawn:
        assert f'data-op="{op}" data-count="{count}"' in dom
    flops = compiled["cost"]["product_flops"]
    assert f'id="product-flops" data-value="{int(flops) if flops == int(flops) else flops}"' in dom
    assert "each device needs" in dom and report["program"] in dom
    # The projection onto an accelerator: its figures and its scaling table, as the JSON has them.
    status, report, stderr = doctor(archive, "--target", "v7x", "--html", str(page))
    assert status == 0, stderr
    dom = subprocess.run([browser, "--no-sandbox", "--disable-gpu", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=60).stdout
    p = report["projection"]
    assert f'id="projected-memory" data-bytes="{p["as_examined"]["memory"]}"' in dom
    assert dom.count('class="n scaling-memory"') == len(p["scaling"])
    for r in p["scaling"][::5]:
        assert f'data-plan="{r["plan"]}" data-chips="{r["chips"]}" data-bytes="{r["memory"]}"' in dom
    assert dom.count("<circle") == len(p["scaling"]) and "Cloud TPU7x" in dom


def test_the_python_report_as_a_page_renders_each_graph_and_the_model(tmp_path):
    """`DoctorReport.html`: the model's graph breaks, training state and projection, and each
    graph's sections, every number the JSON's, rendered by headless Chromium."""
    import shutil

    import tpuc

    browser = shutil.which("chromium-headless-shell")
    assert browser, "chromium-headless-shell is missing: run tools/setup.sh"
    model = _Broken().train()
    report = tpuc.doctor(model, torch.randn(2, 8), training=True, target="v5e")
    # Each graph's parameters count once: the model's state is theirs together.
    assert report.training["parameters"] == sum(p.numel() * p.element_size() for p in model.parameters())
    page = tmp_path / "model.html"
    report.html(page)
    rendered = subprocess.run([browser, "--no-sandbox", "--disable-gpu", "--dump-dom", page.as_uri()],
                              capture_output=True, text=True, timeout=60)
    dom = rendered.stdout
    assert rendered.returncode == 0 and 'data-rendered="yes"' in dom, rendered.stderr[-2000:]
    assert dom.count('class="graph-break"') == len(report.graph_breaks) == 1
    assert dom.count('class="graph"') == len(report.graphs) == 4  # two forwards, two backwards
    for i, graph in enumerate(report.graphs, 1):
        total = graph["compiled"]["memory"]["total"]
        assert f'id="g{i}-memory-total" data-bytes="{total}"' in dom
    for key in ("parameters", "gradients", "optimizer_state", "saved_activations"):
        assert f'id="training-{key}" data-bytes="{report.training[key]}"' in dom
    examined = report.projection["as_examined"]
    assert f'id="projected-memory" data-bytes="{examined["memory"]}"' in dom
    assert dom.count('class="n scaling-memory"') == len(report.projection["scaling"])
    assert "Verdict: ready to run" in dom
