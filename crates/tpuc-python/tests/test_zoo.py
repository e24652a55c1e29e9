"""The model zoo against eager torch: through torch.compile(backend="tpuc") in strict mode (no
eager fallback), and through torch.export -> `tpuc compile` -> `tpuc run`."""
import json
import os
import subprocess

import numpy as np
import pytest
import torch
from models import zoo
from torch.utils._pytree import tree_leaves

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
MODELS = {name: (model, inputs) for name, model, inputs in zoo()}

# float32 through XLA's kernels: sums in another order than torch's. Deeper models accumulate
# more rounding; 1e-4 relative bounds them all with room (measured: at most ~8e-6 absolute).
RTOL, ATOL = 1e-4, 1e-5


def tpuc_binary() -> str:
    """The most recently built tpuc binary (a stale build of the other profile is passed over)."""
    built = [p for p in (os.path.join(ROOT, "target", profile, "tpuc") for profile in ("debug", "release"))
             if os.path.exists(p)]
    if not built:
        pytest.skip("the tpuc binary is not built (cargo build -p tpuc-cli)")
    return max(built, key=os.path.getmtime)


@pytest.mark.parametrize("name", list(MODELS))
def test_torch_compile_matches_eager(name):
    model, inputs = MODELS[name]
    compiled = torch.compile(model, backend="tpuc", options={"strict": True})
    with torch.no_grad():
        expected = model(*inputs)
        torch.testing.assert_close(compiled(*inputs), expected, rtol=RTOL, atol=ATOL)
        # Steady state: the second call reuses the compiled graph and the cached weights.
        torch.testing.assert_close(compiled(*inputs), expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("decompose", [False, True], ids=["raw", "core_aten"])
@pytest.mark.parametrize("name", list(MODELS))
def test_export_compile_run_matches_eager(name, decompose, tmp_path):
    model, inputs = MODELS[name]
    program = torch.export.export(model, inputs)
    if decompose:
        program = program.run_decompositions()
    archive = tmp_path / f"{name}.pt2"
    torch.export.save(program, str(archive))
    with torch.no_grad():
        expected = model(*inputs)
    np.savez(tmp_path / "inputs.npz", *[t.numpy() for t in tree_leaves(inputs)])
    np.savez(tmp_path / "expected.npz", *[t.numpy() for t in tree_leaves(expected)])
    binary = tpuc_binary()
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    module = tmp_path / f"{name}.mlir"
    compiled = subprocess.run([binary, "compile", str(archive), "-o", str(module)], capture_output=True, text=True)
    assert compiled.returncode == 0, compiled.stderr
    run = subprocess.run(
        [binary, "run", str(module), "--weights", str(archive), "--input", str(tmp_path / "inputs.npz"),
         "--out", str(tmp_path / "out"), "--expect", str(tmp_path / "expected.npz"),
         "--rtol", str(RTOL), "--atol", str(ATOL)],
        capture_output=True, text=True, env=env,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "outputs match the reference" in run.stdout


# Exported with dynamic batch and/or sequence length, then run at sizes other than the example's.
DYNAMIC = {
    "llama": ({"tokens": {0: torch.export.Dim("batch", min=1, max=8), 1: torch.export.Dim("seq", min=2, max=64)}},
              [torch.randint(0, 64, (3, 11)), torch.randint(0, 64, (1, 40))]),
    "qwen": ({"tokens": {1: torch.export.Dim("seq", min=2, max=64)}}, [torch.randint(0, 64, (2, 5))]),
    "mingpt": ({"tokens": {1: torch.export.Dim("seq", min=2, max=16)}}, [torch.randint(0, 64, (2, 7))]),
    "resnet18": ({"x": {0: torch.export.Dim("batch", min=1, max=16)}}, [torch.randn(3, 3, 32, 32)]),
}


@pytest.mark.parametrize("name", list(DYNAMIC))
def test_dynamic_export_runs_at_other_sizes(name, tmp_path):
    """`tpuc run` specialises a dynamic-shape export to the sizes of its inputs."""
    model, inputs = MODELS[name]
    dynamic_shapes, others = DYNAMIC[name]
    archive = tmp_path / f"{name}.pt2"
    torch.export.save(torch.export.export(model, inputs, dynamic_shapes=dynamic_shapes).run_decompositions(),
                      str(archive))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    for i, x in enumerate(others):
        with torch.no_grad():
            expected = model(x)
        np.savez(tmp_path / f"inputs{i}.npz", x.numpy())
        np.savez(tmp_path / f"expected{i}.npz", expected.numpy())
        run = subprocess.run(
            [tpuc_binary(), "run", str(archive), "--input", str(tmp_path / f"inputs{i}.npz"),
             "--out", str(tmp_path / "out"), "--expect", str(tmp_path / f"expected{i}.npz"),
             "--rtol", str(RTOL), "--atol", str(ATOL)],
            capture_output=True, text=True, env=env,
        )
        assert run.returncode == 0, run.stdout + run.stderr
        assert f"{list(expected.shape)}" in run.stdout and "outputs match the reference" in run.stdout
    # Unspecialised, `tpuc compile` names the symbols instead of compiling.
    refused = subprocess.run([tpuc_binary(), "compile", str(archive)], capture_output=True, text=True)
    assert refused.returncode != 0 and "symbolic sizes" in refused.stderr and "exported with" in refused.stderr


# Exports run over device meshes through `tpuc run`: each ready plan works over the mesh axis of
# its name; DLRM's embedding tables are split by rows through a plan file. Sharding changes where
# data lives, never the results.
DLRM_PLAN = {"rules": {"embeddings.*.weight": ["dp", None]}, "ready": "dp"}
MESHES = [
    ("llama", "dp=2", "dp"),
    ("llama", "fsdp=2,tp=2", "fsdp,tp"),
    ("qwen", "tp=2", "tp"),
    ("qwen", "fsdp=2", "fsdp"),
    ("mingpt", "fsdp=2,tp=2", "fsdp,tp"),
    ("resnet18", "dp=2", "dp"),
    ("dlrm", "dp=2", DLRM_PLAN),
]


@pytest.mark.parametrize("name,mesh,plan", MESHES, ids=[f"{n}-{m}" for n, m, _ in MESHES])
def test_export_runs_over_a_mesh(name, mesh, plan, tmp_path):
    model, inputs = MODELS[name]
    archive = tmp_path / f"{name}.pt2"
    torch.export.save(torch.export.export(model, inputs), str(archive))
    with torch.no_grad():
        expected = model(*inputs)
    np.savez(tmp_path / "inputs.npz", *[t.numpy() for t in tree_leaves(inputs)])
    np.savez(tmp_path / "expected.npz", *[t.numpy() for t in tree_leaves(expected)])
    if isinstance(plan, dict):
        (tmp_path / "plan.json").write_text(json.dumps(plan))
        plan = str(tmp_path / "plan.json")
    run = subprocess.run(
        [tpuc_binary(), "run", str(archive), "--mesh", mesh, "--plan", plan, "--input", str(tmp_path / "inputs.npz"),
         "--out", str(tmp_path / "out"), "--expect", str(tmp_path / "expected.npz"),
         "--rtol", str(RTOL), "--atol", str(ATOL)],
        capture_output=True, text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "outputs match the reference" in run.stdout
