"""torch.distributed on the tpuc device: the process-group backend registered for it (gloo
underneath), run as users run it: torchrun, two ranks on 127.0.0.1, each on its own device
(device_distributed.py); a rank that dies; and the registration itself, in this process."""
import datetime
import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.distributed as dist

# Each test starts two ranks: on one worker, one after another, so that two such runs do not
# share this machine's two cores four ways.
pytestmark = pytest.mark.xdist_group("ranks")
HERE = os.path.dirname(os.path.abspath(__file__))
ENV = dict(os.environ, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="3")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(*args: str, ranks: int = 2, timeout: int = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--master-addr", "127.0.0.1",
         "--master-port", str(free_port()), *args],
        capture_output=True, text=True, timeout=timeout, cwd=HERE, env=ENV)


def programs(*names: str, ranks: int = 2) -> dict:
    """The JSON lines of device_distributed.py's programs `names`, by program."""
    run = torchrun(os.path.join(HERE, "device_distributed.py"), *names, ranks=ranks)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    results = {r["program"]: r for r in map(json.loads, (line for line in run.stdout.splitlines() if line.startswith("{")))}
    assert sorted(results) == sorted(n.partition("=")[0].partition(":")[0] for n in names), run.stdout
    # torch's warning that DDP's reducer has no timer for the device's type is gone.
    assert "Time stats are currently only collected" not in run.stderr
    return results


def test_every_collective_on_two_ranks_of_the_device_and_a_mismatch_named():
    results = programs("collectives", "mismatch")
    assert len(results["collectives"]["checked"]) == 13, results["collectives"]
    error = results["mismatch"]["error"]
    assert error is not None and "called different collectives" in error, error
    assert "rank 0 (this one): all_reduce (sum) of float32[4]" in error and "rank 1: all_reduce (sum) of float32[5]" in error


# The Llama run is the suite's longest (about 50 s beside another worker): with the cores to itself.
@pytest.mark.parametrize("model", ["mlp", pytest.param("llama", marks=pytest.mark.alone)])
def test_ddp_fsdp2_and_tensor_parallel_train_on_the_device_as_on_the_cpu(model, tmp_path):
    program = f"training:{model}" + (f"={tmp_path / 'checkpoint'}" if model == "llama" else "")
    differences = programs(program)["training"]["differences"]
    assert len(differences) == (5 if model == "llama" else 4), differences
    for name, difference in differences.items():
        assert difference < 1e-5, (name, difference)


def test_fsdp2_and_tensor_parallel_over_a_2d_mesh_of_four_ranks_train_as_on_the_cpu():
    result = programs("mesh_2d", ranks=4)["mesh_2d"]
    # Each parameter is sharded over both dimensions of the mesh (FSDP2's dim 0 on dp, TP's on tp).
    assert any("Shard" in p and p.count("Shard") == 2 for p in result["placements"]), result
    assert result["difference"] < 1e-5, result


DIES = textwrap.dedent("""
    import datetime, os, sys, time, torch, torch.distributed as dist
    dist.init_process_group(timeout=datetime.timedelta(seconds=20))
    if dist.get_rank() == 1:
        os._exit(3)
    time.sleep(1)
    started = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4, device="tpuc"))
    except RuntimeError as error:
        print("raised after", round(time.monotonic() - started), "s:", str(error).splitlines()[0], flush=True)
        os._exit(1)
    print("no error", flush=True)
""")


def test_a_rank_that_dies_makes_the_others_fail_not_hang(tmp_path):
    script = tmp_path / "dies.py"
    script.write_text(DIES)
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE,
                              env=dict(ENV, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), LOCAL_WORLD_SIZE="2",
                                       MASTER_ADDR="127.0.0.1", MASTER_PORT=port))
             for r in range(2)]
    out, err = procs[0].communicate(timeout=120)
    procs[1].wait(timeout=30)
    assert procs[1].returncode == 3
    assert procs[0].returncode == 1 and "raised after" in out, out + err[-3000:]


def test_the_backend_is_the_device_default_and_passes_host_tensors_to_gloo():
    assert dist.Backend.default_device_backend_map["tpuc"] == "tpuc"
    assert dist.Backend.default_device_backend_map["cpu"] == "gloo"
    dist.init_process_group("tpuc", store=dist.HashStore(), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    try:
        assert dist.get_backend_config() in ("cpu:tpuc,tpuc:tpuc", "tpuc:tpuc,cpu:tpuc"), dist.get_backend_config()
        on_device = torch.arange(4.0, device="tpuc")
        on_host = torch.arange(4.0)
        dist.all_reduce(on_device)
        dist.all_reduce(on_host)
        assert torch.equal(on_device.cpu(), on_host)
        with pytest.raises(ValueError, match="takes no backend options"):
            dist.new_group(backend="tpuc", pg_options=dist.ProcessGroupGloo._Options())
    finally:
        dist.destroy_process_group()
