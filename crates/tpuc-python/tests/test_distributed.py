"""torch.distributed programs with backend="tpuc", one process per rank: torchrun starts two
ranks with gloo on 127.0.0.1 (bounded by a timeout; the process group too) that train DDP, FSDP2,
DTensor tensor parallel and SimpleFSDP-style models both compiled and eager (see
distributed_programs.py). Collectives run in torch; everything else through tpuc."""
import json
import os
import socket
import subprocess
import sys

import pytest

# Two ranks: on the worker that runs the other tests starting ranks (test_device_distributed.py).
pytestmark = pytest.mark.xdist_group("ranks")
PROGRAMS = ["ddp", "fsdp2", "tp", "simple_fsdp"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_torch_distributed_programs_train_as_in_eager():
    here = os.path.dirname(os.path.abspath(__file__))
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
         "--master-port", str(free_port()), os.path.join(here, "distributed_programs.py"), *PROGRAMS],
        capture_output=True, text=True, timeout=300, cwd=here,
        env=dict(os.environ, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="3"),
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    results = {r["program"]: r for r in map(json.loads, (line for line in run.stdout.splitlines() if line.startswith("{")))}
    assert sorted(results) == sorted(PROGRAMS), run.stdout
    for program, r in results.items():
        assert r["compiled"] > 0, f"{program}: tpuc compiled nothing"
        assert r["loss_diff"] < 1e-5 and r["param_diff"] < 1e-5, (program, r)
