"""PyTorch's OpInfo database through the backend in strict mode: the CI subset (a documented
selection of common ops, float32 and int64, first sample). `tools/conformance.py --write` runs
every op and dtype and writes docs/conformance.md."""
import importlib.util
import os

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def load_runner():
    spec = importlib.util.spec_from_file_location("conformance", os.path.join(ROOT, "tools", "conformance.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_opinfo_ci_subset_passes():
    runner = load_runner()
    results = runner.run(runner.CI_OPS, runner.CI_DTYPES, samples=1)
    counts, rate = runner.summary(results)
    failures = [f"{r['op']} {r['dtype']}: {r['status']}: {r['reason']}" for r in results
                if r["status"] in ("failed", "not reached")]
    assert counts["passed"] >= 100, counts
    assert rate >= 0.95, "\n".join(failures)
