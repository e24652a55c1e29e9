#!/usr/bin/env python3
"""torch.distributed training steps on the tpuc device (its process-group backend, gloo
underneath) against the same steps on the CPU (gloo), interleaved in the same processes: DDP and
FSDP2 of an MLP stack (4 blocks of 512 -> 2048 -> 512, a batch of 32 per rank), eager on each.
Prints the steady time per step of each, their ratio, and what the device's backend moved per
step: the bytes of the tensors handed to its collectives and the bytes it copied between the
device and the host for gloo.

Usage: .venv/bin/python tools/bench_distributed.py [--ranks 2] [--steps 10]
(it starts itself under torchrun, gloo on 127.0.0.1; run on an idle machine).
"""
import argparse
import json
import os
import subprocess
import sys
import time


def model():
    import torch.nn as nn

    blocks = [nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512)) for _ in range(4)]
    return nn.Sequential(*blocks)


def worker(steps: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    from tpuc import _tpuc_native

    torch.set_num_threads(1)
    torch.tpuc.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("tpuc")  # tpuc tensors on the device's backend, host tensors on gloo
    rank = dist.get_rank()
    device = torch.device("tpuc", torch.tpuc.current_device())

    def build(kind: str, where: torch.device):
        torch.manual_seed(0)
        m = model().to(where)
        if kind == "ddp":
            return DistributedDataParallel(m)
        for block in m:
            fully_shard(block)
        return fully_shard(m)

    def timed(kind: str, where: torch.device) -> tuple[float, dict]:
        m = build(kind, where)
        optimizer = torch.optim.SGD(m.parameters(), lr=1e-3)
        torch.manual_seed(rank)
        x = torch.randn(32, 512).to(where)

        def step():
            loss = m(x).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            return loss.item()

        for _ in range(2):
            step()
        before = _tpuc_native.distributed_stats()
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        after = _tpuc_native.distributed_stats()
        moved = {k: (after[k] - before[k]) / steps for k in after}
        return sorted(times)[len(times) // 2], moved

    rows = []
    for kind in ("ddp", "fsdp2"):
        cpu, _ = timed(kind, torch.device("cpu"))
        dev, moved = timed(kind, device)
        rows.append({"kind": kind, "cpu_s": cpu, "device_s": dev, **moved})
    if rank == 0:
        print(json.dumps(rows), flush=True)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.steps)
        return
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.ranks),
                          "--master-addr", "127.0.0.1", "--master-port", "29531", __file__, "--worker",
                          "--steps", str(args.steps)],
                         capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1",
                                                                  TF_CPP_MIN_LOG_LEVEL="3"))
    lines = [line for line in run.stdout.splitlines() if line.startswith("[")]
    if run.returncode != 0 or not lines:
        sys.exit(f"bench_distributed: the ranks failed:\n{run.stdout[-2000:]}{run.stderr[-4000:]}")
    print(f"{'':6} {'cpu ms/step':>12} {'device ms/step':>15} {'device/cpu':>10} {'collectives':>11} "
          f"{'tensor MB':>9} {'to host MB':>10} {'to device MB':>12}")
    for r in json.loads(lines[-1]):
        print(f"{r['kind']:6} {1e3 * r['cpu_s']:12.2f} {1e3 * r['device_s']:15.2f} {r['device_s'] / r['cpu_s']:10.2f} "
              f"{r['collectives']:11.1f} {r['tensor_bytes'] / 1e6:9.2f} {r['to_host_bytes'] / 1e6:10.2f} "
              f"{r['to_device_bytes'] / 1e6:12.2f}")


if __name__ == "__main__":
    main()
