"""PyTorch's OpInfo database through the backend in strict mode and on the tpuc device in strict
and fused eager mode: the CI subset (a documented selection of common ops, float32 and int64,
first sample). `tools/conformance.py --write` runs every op and dtype and writes
docs/conformance.md (`--mode strict|fused`: docs/conformance-<mode>.md)."""
import importlib.util
import os

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def load_runner():
    spec = importlib.util.spec_from_file_location("conformance", os.path.join(ROOT, "tools", "conformance.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("mode", ["compiled", "strict", "fused"])
def test_opinfo_ci_subset_passes(mode):
    runner = load_runner()
    results = runner.run(runner.CI_OPS, runner.CI_DTYPES, samples=1, mode=mode)
    counts, rate = runner.summary(results)
    failures = [f"{r['op']} {r['dtype']}: {r['status']}: {r['reason']}" for r in results
                if r["status"] in ("failed", "not reached")]
    assert counts["passed"] >= 100, counts
    assert rate >= 0.95, "\n".join(failures)
