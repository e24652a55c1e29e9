#!/usr/bin/env python3
"""TorchTitan 0.3.0, unmodified, on the tpuc device: its Llama3 debug model (`llama3_debugmodel`)
trained under torchrun in four configurations — one rank in eager, one rank compiled
(`--compile.enable`: each block compiled by tpuc), two ranks with FSDP, two with tensor
parallelism — from one seed checkpoint. Prints each one's steady steps per second (the median of
TorchTitan's own per-step throughput, from the third step on), its ratio to the one compiled
rank, and what the device's process-group backend did per step: collectives, the bytes of the
tensors handed to them, the bytes it copied to the host for gloo and back.

TorchTitan cannot run on the CPU unmodified (it takes CUDA when no accelerator is present), so
the compiled path on the device is the baseline.

Usage: .venv/bin/python tools/bench_torchtitan.py [--steps 12] [--seq-len 64] [--batch 2]
(tools/setup.sh installs TorchTitan into .venv-titan; run on an idle machine).
"""
import argparse
import atexit
import json
import os
import re
import runpy
import socket
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = os.path.join(ROOT, ".venv-titan", "bin", "python")
STEP = re.compile(r"step:\s*(\d+)\s+loss:\s*([-\d.naif]+).*?tps:\s*([\d,]+)")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
STATS = "tpuc-distributed-stats: "
CONFIGURATIONS = {
    "1 rank, eager": (1, []),
    "1 rank, compiled": (1, ["--compile.enable"]),
    "2 ranks, FSDP": (2, ["--parallelism.data_parallel_shard_degree", "2"]),
    "2 ranks, tensor parallel": (2, ["--parallelism.tensor_parallel_degree", "2"]),
}


def rank_main(titan_args: list[str]) -> None:
    """One rank: TorchTitan's own entry point, run as `python -m torchtitan.train` runs it, and
    at exit the device backend's counters."""
    from tpuc import _tpuc_native

    atexit.register(lambda: print(STATS + json.dumps(_tpuc_native.distributed_stats()), flush=True))
    sys.argv = ["torchtitan.train", *titan_args]
    runpy.run_module("torchtitan.train", run_name="__main__")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(where: str, ranks: int, flags: list[str], dump: str) -> str:
    command = [PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--master-addr", "127.0.0.1",
               "--master-port", str(free_port()), __file__, "--rank", "--", *flags, "--dump_folder",
               os.path.join(where, dump)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=where,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore"))
    out = ANSI.sub("", done.stdout + done.stderr)
    if done.returncode != 0:
        sys.exit(f"bench_torchtitan: {dump} failed:\n{out[-6000:]}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch", type=int, default=2, help="local batch size")
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.rank:
        rank_main(rest[1:] if rest[:1] == ["--"] else rest)
        return
    if not os.path.exists(PYTHON):
        sys.exit(f"bench_torchtitan: {PYTHON} is missing: tools/setup.sh installs TorchTitan there")
    sys.path.insert(0, os.path.join(ROOT, "crates", "tpuc-python", "tests"))
    from torchtitan_assets import make_assets

    where = tempfile.mkdtemp(prefix="tpuc-titan-")
    make_assets(where)
    common = ["--module", "llama3", "--config", "llama3_debugmodel", "--debug.seed", "42",
              "--training.seq_len", str(args.seq_len), "--training.local_batch_size", str(args.batch)]
    run(where, 1, [*common, "--checkpoint.enable", "--checkpoint.create_seed_checkpoint"], "seed")
    seed = ["--checkpoint.enable", "--checkpoint.load_only", "--checkpoint.initial_load_path",
            os.path.join(where, "seed", "checkpoint", "step-0")]
    tokens = args.seq_len * args.batch
    rows = {}
    for name, (ranks, flags) in CONFIGURATIONS.items():
        out = run(where, ranks, [*common, *seed, "--training.steps", str(args.steps), *flags], name.replace(" ", "_"))
        throughput = {int(m[1]): float(m[3].replace(",", "")) for m in STEP.finditer(out)}
        steady = [tps for step, tps in throughput.items() if step >= 3]
        stats = [json.loads(line[len(STATS):]) for line in out.splitlines() if line.startswith(STATS)]
        per_step = {k: sum(s[k] for s in stats) / len(stats) / args.steps for k in stats[0]} if stats else {}
        rows[name] = (statistics.median(steady) / tokens, per_step)
        print(f"  {name}: done", file=sys.stderr)
    baseline = rows["1 rank, compiled"][0]
    print(f"{'':26} {'steps/s':>8} {'/compiled':>9} {'collectives':>11} {'tensor MB':>9} {'to host MB':>10} "
          f"{'to device MB':>12}   (per rank and step)")
    for name, (rate, moved) in rows.items():
        print(f"{name:26} {rate:8.2f} {rate / baseline:9.2f} {moved.get('collectives', 0):11.1f} "
              f"{moved.get('tensor_bytes', 0) / 1e6:9.2f} {moved.get('to_host_bytes', 0) / 1e6:10.2f} "
              f"{moved.get('to_device_bytes', 0) / 1e6:12.2f}")


if __name__ == "__main__":
    main()
