"""The torch.compile backend: registration, options, numerics, caching, fallbacks, shapes."""
import json
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from tpuc.runtime import STATS


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.norm = nn.LayerNorm(32)
        self.fc2 = nn.Linear(32, 8)

    def forward(self, x):
        return torch.softmax(self.fc2(torch.nn.functional.gelu(self.norm(self.fc1(x)))), dim=-1)


def close(a, b, tol=1e-5):
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def test_backend_is_registered_without_import():
    code = (
        "import sys, torch\n"
        "f = torch.compile(lambda x: torch.sin(x) * 2 + 1, backend='tpuc')\n"
        "x = torch.linspace(-3, 3, 7)\n"
        "torch.testing.assert_close(f(x), torch.sin(x) * 2 + 1)\n"
        "print('tpuc' in sys.modules)\n"
    )
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"  # loaded by torch through the entry point


_PLAIN_USE = """
import torch
m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
x = torch.randn(2, 4)
with torch.no_grad():
    ok = torch.allclose(torch.compile(m, backend="tpuc")(x), m(x), atol=1e-5)
print("ok" if ok else "mismatch")
"""


def test_a_plain_use_from_elsewhere_finds_the_plugin_and_prints_nothing(tmp_path):
    """As a user runs it: the venv's python, not activated, from another directory, XLA's log
    level not set. The plugin is found in the interpreter's own environment, and neither a
    compile nor a load from the cache of compiled executables writes anything to stderr."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "TF_CPP_MIN_LOG_LEVEL")}
    env["TPUC_CACHE_DIR"] = str(tmp_path / "cache")
    for attempt in ("compiled", "loaded from the cache"):
        run = subprocess.run([sys.executable, "-c", _PLAIN_USE], capture_output=True, text=True,
                             env=env, cwd=tmp_path)
        assert run.returncode == 0, f"{attempt}: {run.stderr[-3000:]}"
        assert run.stdout.strip() == "ok", attempt
        assert run.stderr == "", f"{attempt}: {run.stderr}"


def test_inference_matches_eager():
    model = MLP().eval()
    x = torch.randn(4, 16)
    compiled = torch.compile(model, backend="tpuc")
    with torch.no_grad():
        close(compiled(x), model(x))


def test_options_pass_through_and_are_checked(tmp_path):
    model = MLP().eval()
    x = torch.randn(2, 16)
    compiled = torch.compile(model, backend="tpuc", options={"plugin": "cpu", "dump_dir": str(tmp_path)})
    with torch.no_grad():
        close(compiled(x), model(x))
    names = sorted(os.listdir(tmp_path))
    assert any(n.endswith(".mlir") for n in names), names
    assert any(n.endswith(".fx.txt") for n in names), names
    report = json.loads((tmp_path / next(n for n in names if n.endswith(".json"))).read_text())
    assert report["xla_compile_seconds"] > 0
    mlir = (tmp_path / next(n for n in names if n.endswith(".mlir"))).read_text()
    assert "stablehlo.dot_general" in mlir and "test_backend.py" in mlir  # source locations

    bad = torch.compile(model, backend="tpuc", options={"plugn": "cpu"})
    with pytest.raises(Exception, match="unknown tpuc option"):
        bad(x)


@pytest.mark.parametrize("keep", [False, True])
def test_keep_whole_hands_the_op_to_tpuc_undecomposed(tmp_path, keep):
    x = torch.randn(3, 8)
    options = {"strict": True, "dump_dir": str(tmp_path)}
    if keep:
        options["keep_whole"] = ["aten.silu.default"]
    close(torch.compile(F.silu, backend="tpuc", options=options)(x), F.silu(x))
    graph = "".join(p.read_text() for p in tmp_path.glob("*.fx.txt"))
    # torch's decomposition computes silu as x * sigmoid(x).
    assert ("aten.silu.default" in graph, "aten.sigmoid.default" in graph) == (keep, not keep), graph


def test_parameters_stay_on_device_between_calls():
    model = MLP().eval()
    compiled = torch.compile(model, backend="tpuc")
    x = torch.randn(4, 16)
    with torch.no_grad():
        compiled(x)
        before = dict(STATS)
        compiled(x.clone())
        after = dict(STATS)
        params = len(list(model.parameters()))
        assert after["uploads"] - before["uploads"] == 1  # the input only
        assert after["reused"] - before["reused"] == params
        # An in-place update bumps the parameter's version: it is uploaded again.
        model.fc2.bias.add_(1.0)
        close(compiled(x), model(x))
        assert STATS["uploads"] - after["uploads"] == 1


def test_shape_and_dtype_changes_recompile():
    f = torch.compile(lambda a, b: (a @ b).relu().sum(-1), backend="tpuc", dynamic=False)
    for n in (3, 5):
        a, b = torch.randn(n, 4), torch.randn(4, 6)
        close(f(a, b), (a @ b).relu().sum(-1))
    a, b = torch.randn(3, 4, dtype=torch.float64), torch.randn(4, 6, dtype=torch.float64)
    close(f(a, b), (a @ b).relu().sum(-1))


def test_dynamic_shapes_are_specialised_per_size():
    f = torch.compile(lambda x: torch.cumsum(x * 2, dim=0) + x.shape[0], backend="tpuc", dynamic=True)
    for n in (4, 7, 9):
        x = torch.randn(n, 3)
        close(f(x), torch.cumsum(x * 2, dim=0) + n)


def test_a_dynamic_graph_is_compiled_per_size_without_tracing_again(monkeypatch):
    """The symbolic graph is serialized once; the compiler fixes its sizes from the inputs'
    shapes. A size that no input's shape gives (an integer argument) is traced again per size."""
    from torch.fx.experimental import proxy_tensor

    traced = []
    real = proxy_tensor.make_fx
    monkeypatch.setattr(proxy_tensor, "make_fx", lambda *a, **k: traced.append(1) or real(*a, **k))
    f = torch.compile(lambda x, y: (x @ y.t()).softmax(-1) * x.shape[0] + y[: x.shape[0] // 2].sum(),
                      backend="tpuc", dynamic=True)
    for n in (4, 7, 9, 12):
        x, y = torch.randn(n, 3), torch.randn(n + 1, 3)
        close(f(x, y), (x @ y.t()).softmax(-1) * n + y[: n // 2].sum())
    assert not traced
    g = torch.compile(lambda x, k: x * k, backend="tpuc", dynamic=True)
    for k in (2, 3, 5):
        x = torch.randn(k + 1)
        close(g(x, k), x * k)
    assert traced


def unsupported_fn(x):
    y = torch.linalg.matrix_exp(x.view(-1, 1, 1)).view(-1) + 1  # not lowered by tpuc
    return torch.tanh(y) * 3


def test_unsupported_ops_fall_back_with_one_warning():
    x = torch.randn(5)
    f = torch.compile(unsupported_fn, backend="tpuc")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        close(f(x), unsupported_fn(x))
    messages = [str(w.message) for w in caught if "tpuc" in str(w.message)]
    assert len(messages) == 1, messages
    assert "aten.linalg_matrix_exp.default x1" in messages[0] and "test_backend.py" in messages[0]


def test_strict_mode_refuses_unsupported_ops():
    f = torch.compile(unsupported_fn, backend="tpuc", options={"strict": True})
    with pytest.raises(Exception, match=r"(?s)cannot lower.*aten\.linalg_matrix_exp\.default.*test_backend\.py:\d+"):
        f(torch.randn(5))


def test_strict_mode_from_the_environment(monkeypatch):
    monkeypatch.setenv("TPUC_STRICT", "1")
    f = torch.compile(unsupported_fn, backend="tpuc")
    with pytest.raises(Exception, match="strict mode"):
        f(torch.randn(5))


def test_dump_dir_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("TPUC_DUMP_DIR", str(tmp_path))
    f = torch.compile(lambda x: x * 2, backend="tpuc")
    f(torch.ones(2))
    names = os.listdir(tmp_path)
    assert any(n.endswith(".mlir") for n in names)
    # tpuc's own IR after its passes, one line per op.
    (ir,) = [tmp_path / n for n in names if n.endswith(".ir.txt")]
    assert "stablehlo.multiply" in ir.read_text() and "func @main(" in ir.read_text()


def test_outputs_and_inputs_of_many_dtypes():
    def f(a, b, c):
        return a.to(torch.bfloat16) * 2, (b > 1) & c, b * 3, a.half() + 1

    a = torch.randn(3, 4)
    b = torch.arange(12).reshape(3, 4)
    c = torch.rand(3, 4) > 0.5
    got = torch.compile(f, backend="tpuc")(a, b, c)
    for g, e in zip(got, f(a, b, c)):
        assert g.dtype == e.dtype
        close(g, e, tol=1e-3)


def test_non_contiguous_inputs():
    f = torch.compile(lambda x: x.exp() - 1, backend="tpuc")
    x = torch.randn(6, 4).t()
    close(f(x), x.exp() - 1)


def test_identical_graphs_compile_once():
    def f(x):
        return torch.tanh(x) @ x.t()

    x = torch.randn(3, 3)
    torch.compile(f, backend="tpuc")(x)
    before = STATS["compiles"]
    torch._dynamo.reset()  # Dynamo forgets; tpuc's executable cache does not
    close(torch.compile(f, backend="tpuc")(x), f(x))
    assert STATS["compiles"] == before


# A process compiling a convolution with batch norm (whose graph has weight-derived values, so
# two executables) and reporting what the cache of compiled executables did.
_CACHED_RUN = """
import json, torch
from tpuc.runtime import STATS
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
model, x = model.eval(), torch.randn(2, 3, 8, 8)
with torch.no_grad():
    out = torch.compile(model, backend="tpuc", options={options!r})(x)
    torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-5)
print(json.dumps(dict(STATS)))
"""


def _cached_run(options: dict, env: dict | None = None):
    code = _CACHED_RUN.format(options=options)
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"} | (env or {})
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1]), run.stderr


def test_compiled_executables_are_loaded_by_later_processes(tmp_path):
    cache = str(tmp_path / "cache")
    first, _ = _cached_run({}, {"TPUC_CACHE_DIR": cache})
    assert first["compiles"] == 1 and first["cache_hits"] == 0
    def executables(directory):
        return sorted(e for e in os.listdir(directory) if e.endswith(".pjrt"))

    entries = executables(cache)
    # Two executables, and the record of what the cache did (`tpuc cache --stats`).
    assert len(entries) == 2 and sorted(os.listdir(cache)) == sorted(entries + ["stats.jsonl"]), os.listdir(cache)
    second, stderr = _cached_run({}, {"TPUC_CACHE_DIR": cache})
    assert second["compiles"] == 1 and second["cache_hits"] == 1
    # XLA:CPU's loader logs a false alarm per load on CPUs with tuning features; tpuc drops it.
    assert "cpu_aot_loader" not in stderr, stderr[-3000:]
    # The option wins over the environment.
    other = str(tmp_path / "other")
    third, _ = _cached_run({"cache_dir": other}, {"TPUC_CACHE_DIR": cache})
    assert third["cache_hits"] == 0 and len(executables(other)) == 2
    assert executables(cache) == entries


def test_the_cache_can_be_turned_off_and_dumps_say_what_it_did(tmp_path):
    x = torch.randn(5)
    for cache_dir, expected in ((str(tmp_path / "c"), "stored"), ("off", "off")):
        # The options (cache_dir among them) are part of the key of the process's own table of
        # compiled graphs: each round compiles.
        torch._dynamo.reset()
        dump = tmp_path / f"dump-{expected}"
        f = torch.compile(lambda y: torch.cos(y) + 3, backend="tpuc",
                          options={"cache_dir": cache_dir, "dump_dir": str(dump)})
        close(f(x), torch.cos(x) + 3)
        (record,) = [json.loads(p.read_text()) for p in dump.glob("*.json")]
        assert record["cache"] == expected, record
    assert not (tmp_path / "off").exists()


def test_a_cache_that_cannot_store_warns_once_and_compiles(tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    model, x = MLP().eval(), torch.randn(4, 16)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        from tpuc import runtime

        runtime.session(None).cache_warned = False
        out = torch.compile(model, backend="tpuc", options={"cache_dir": str(blocked)})(x)
        torch.compile(lambda y: y.exp(), backend="tpuc", options={"cache_dir": str(blocked)})(x)
    close(out, model(x))
    said = [str(w.message) for w in caught if "not cached" in str(w.message)]
    assert len(said) == 1 and str(blocked) in said[0], said
