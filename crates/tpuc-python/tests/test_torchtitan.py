"""TorchTitan 0.3.0, unmodified, on the tpuc device: its Llama3 debug model trained under
torchrun from a temporary directory, as its users run it (`python -m torchtitan.train --module
llama3 --config llama3_debugmodel`, short sequences and few steps): one rank in eager, one rank
compiled (TorchTitan compiles with torch.compile's default backend, which hands graphs over the
device's tensors to tpuc), two ranks with FSDP and two with tensor parallelism.

TorchTitan's test assets are not on PyPI: the tests make a small byte-level BPE tokenizer and a text
data set of their own (torchtitan_assets.py). Every run starts from one seed checkpoint (TorchTitan's
`--checkpoint.create_seed_checkpoint`): DTensor draws a sharded parameter's initial values per
shard, so only runs that load the same weights can be compared. TorchTitan is installed by
tools/setup.sh into .venv-titan, a venv layered over .venv (its torch, tpuc)."""
import math
import os
import re
import socket
import subprocess

import pytest
from torchtitan_assets import make_assets

# Each run compiles the device's op programs afresh (the session's cache starts empty), on as many
# processes as ranks: beside another test worker they would take twice as long.
pytestmark = [pytest.mark.alone, pytest.mark.xdist_group("ranks")]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PYTHON = os.path.join(ROOT, ".venv-titan", "bin", "python")
TRAIN = ["--module", "llama3", "--config", "llama3_debugmodel", "--debug.seed", "42", "--debug.deterministic",
         "--training.seq_len", "64", "--training.local_batch_size", "2", "--training.steps", "3"]
STEP = re.compile(r"step:\s*(\d+)\s+loss:\s*([-\d.naif]+)\s+grad_norm:\s*([-\d.naif]+)")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchtitan(where: str, ranks: int, *flags: str, dump: str) -> subprocess.CompletedProcess:
    """`python -m torchtitan.train` under torchrun on `ranks` ranks, from `where`."""
    run = subprocess.run(
        [PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--master-addr", "127.0.0.1",
         "--master-port", str(free_port()), "-m", "torchtitan.train", *TRAIN, *flags,
         "--dump_folder", os.path.join(where, dump)],
        capture_output=True, text=True, timeout=240, cwd=where,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore"))
    assert run.returncode == 0, run.stdout[-3000:] + ANSI.sub("", run.stderr)[-8000:]
    return run


def losses(run: subprocess.CompletedProcess) -> list[tuple[float, float]]:
    """Each step's loss and gradient norm, as TorchTitan logs them (every rank logs the same)."""
    found = {}
    for match in STEP.finditer(ANSI.sub("", run.stdout + run.stderr)):
        found.setdefault(int(match[1]), (float(match[2]), float(match[3])))
    assert sorted(found) == [1, 2, 3], ANSI.sub("", run.stderr)[-4000:]
    return [found[step] for step in sorted(found)]


@pytest.fixture(scope="session")
def workdir(tmp_path_factory):
    if not os.path.exists(PYTHON):
        pytest.fail(f"{PYTHON} is missing: tools/setup.sh installs TorchTitan there")
    where = str(tmp_path_factory.mktemp("torchtitan"))
    make_assets(where)
    torchtitan(where, 1, "--checkpoint.enable", "--checkpoint.create_seed_checkpoint", dump="seed")
    return where


def from_seed(where: str) -> list[str]:
    return ["--checkpoint.enable", "--checkpoint.load_only",
            "--checkpoint.initial_load_path", os.path.join(where, "seed", "checkpoint", "step-0")]


@pytest.fixture(scope="session")
def one_rank(workdir):
    return losses(torchtitan(workdir, 1, *from_seed(workdir), dump="eager"))


def assert_trains(steps: list[tuple[float, float]]) -> None:
    assert all(math.isfinite(loss) and math.isfinite(norm) for loss, norm in steps), steps
    assert steps[-1][0] < steps[0][0] - 0.4, steps


def assert_same(steps, expected) -> None:
    for (loss, norm), (want_loss, want_norm) in zip(steps, expected):
        assert loss == pytest.approx(want_loss, rel=2e-4) and norm == pytest.approx(want_norm, rel=2e-4), (steps, expected)


def test_the_seed_checkpoint_is_made(workdir):
    assert os.path.exists(os.path.join(from_seed(workdir)[-1], ".metadata"))


def test_one_rank_in_eager_trains(one_rank):
    assert_trains(one_rank)


def test_one_rank_compiled_equals_eager(workdir, one_rank):
    run = torchtitan(workdir, 1, *from_seed(workdir), "--compile.enable", dump="compiled")
    # TorchTitan compiles each block with torch.compile's default backend, which handed them to tpuc.
    assert "Compiling each TransformerBlock" in run.stdout + run.stderr
    assert "compiled by tpuc" in run.stdout + run.stderr
    assert_same(losses(run), one_rank)


def test_two_ranks_with_fsdp_train(workdir):
    assert_trains(losses(torchtitan(workdir, 2, *from_seed(workdir), "--parallelism.data_parallel_shard_degree", "2",
                                    dump="fsdp")))


def test_two_ranks_with_tensor_parallelism_equal_one_rank(workdir, one_rank):
    steps = losses(torchtitan(workdir, 2, *from_seed(workdir), "--parallelism.tensor_parallel_degree", "2", dump="tp"))
    assert_same(steps, one_rank)
