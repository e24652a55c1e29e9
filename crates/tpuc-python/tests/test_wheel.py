"""The wheel as a user installs it: built by tools/build_wheel.sh, installed with pip into a
fresh venv outside the repository (torch and the CPU plugin reached from the project's venv
through a .pth file: no download), then used from a temporary directory: a model through
torch.compile(backend="tpuc") and on the tpuc device, and `tpuc compile` + `tpuc run` on an
exported archive through the wheel's `tpuc` command."""
import os
import subprocess
import sys
import sysconfig

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

USER_SCRIPT = """
import sys
import numpy as np
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
x = torch.randn(4, 6)
import copy
on_device = copy.deepcopy(model).to("tpuc")(x.to("tpuc"))
assert on_device.device.type == "tpuc" and torch.allclose(on_device.cpu(), model(x), atol=1e-5)
compiled = torch.compile(model, backend="tpuc")
assert torch.allclose(compiled(x), model(x), atol=1e-5)
import tpuc
assert tpuc.__file__.startswith(sys.prefix), tpuc.__file__
program = torch.export.export(model, (x,))
torch.export.save(program, "model.pt2")
np.save("x.npy", x.numpy())
np.save("want.npy", model(x).detach().numpy())
print("ok")
"""


def _run(args, cwd, **kwargs):
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    run = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=600,
                         env=dict(env, TF_CPP_MIN_LOG_LEVEL="3"), **kwargs)
    assert run.returncode == 0, f"{args}:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    return run


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A fresh venv with the wheel installed: its python and its bin directory."""
    root = tmp_path_factory.mktemp("wheel")
    wheel = _run(["bash", os.path.join(ROOT, "tools", "build_wheel.sh"), "--out", str(root / "dist")],
                 cwd=ROOT).stdout.split()[-1]
    env = root / "env"
    _run([sys.executable, "-m", "venv", "--without-pip", str(env)], cwd=root)
    python = str(env / "bin" / "python")
    site = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=root).stdout.strip()
    # torch, numpy and the CPU plugin from the project's venv (what pip would download).
    with open(os.path.join(site, "project-venv.pth"), "w") as out:
        out.write(sysconfig.get_paths()["purelib"] + "\n")
    _run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", wheel], cwd=root)
    return python, env / "bin"


def test_the_wheel_names_the_torch_its_native_layer_was_built_with():
    import tomllib

    import torch

    with open(os.path.join(ROOT, "crates", "tpuc-python", "pyproject.toml"), "rb") as f:
        dependencies = tomllib.load(f)["project"]["dependencies"]
    # `==2.15.0` admits the local builds of 2.15.0 (2.15.0+cu132, PyPI's default).
    assert f"torch=={torch.__version__.split('+')[0]}" in dependencies, dependencies
    from tpuc import _tpuc_native
    assert _tpuc_native.torch_version == torch.__version__


# Both tests use one wheel, built once: one pytest-xdist worker runs them.
pytestmark = pytest.mark.xdist_group("wheel")


def test_the_wheel_installs_into_a_fresh_venv_and_runs_models(installed, tmp_path):
    python, bin_dir = installed
    assert _run([python, "-c", USER_SCRIPT], cwd=tmp_path).stdout.split() == ["ok"]
    tpuc = str(bin_dir / "tpuc")
    assert _run([tpuc, "--version"], cwd=tmp_path).stdout.startswith("tpuc ")
    _run([tpuc, "compile", "model.pt2", "-o", "model.mlir"], cwd=tmp_path)
    assert "stablehlo" in (tmp_path / "model.mlir").read_text()
    _run([tpuc, "run", "model.pt2", "--input", "x.npy", "--out", "out"], cwd=tmp_path)
    np.testing.assert_allclose(np.load(tmp_path / "out" / "out0.npy"), np.load(tmp_path / "want.npy"), atol=1e-5)


def test_the_wheels_command_reports_bad_input_as_the_binary_does(installed, tmp_path):
    python, bin_dir = installed
    tpuc = str(bin_dir / "tpuc")
    # A compiled module run with an archive other than its own (or one changed since) is refused.
    _run([python, "-c", "import torch\n"
          "x = torch.randn(2, 4)\n"
          "for name, out in (('a', 3), ('b', 5)):\n"
          "    torch.export.save(torch.export.export(torch.nn.Linear(4, out), (x,)), name + '.pt2')\n"
          "import numpy; numpy.save('x.npy', x.numpy())\n"], cwd=tmp_path)
    _run([tpuc, "compile", "a.pt2", "-o", "a.mlir"], cwd=tmp_path)
    run = subprocess.run([tpuc, "run", "a.mlir", "--weights", "b.pt2", "--input", "x.npy", "--out", "out"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and "the archive is not the one the module was compiled from" in run.stderr, run
    (tmp_path / "broken.pt2").write_bytes(b"PK\x03\x04 not an archive")
    run = subprocess.run([tpuc, "compile", "broken.pt2", "-o", "x.mlir"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 1 and run.stderr.startswith("error: ") and "broken.pt2" in run.stderr, run
    run = subprocess.run([tpuc, "no-such-command"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "unrecognized subcommand" in run.stderr, run
