#!/usr/bin/env python3
"""Eager execution on a device compared on this machine: torch's CPU eager, the tpuc device in
strict and in fused mode, tpuc's compile backend (`torch.compile(backend="tpuc")`), and Google's TorchTPU in its strict and
fused eager modes on the same XLA CPU plugin (when it is installed: tools/bench_eager.sh sets it
up in .venv-torchtpu).

Workloads (each call ends with its result computed: the device synchronized while the result is
referenced, or a loss read; fused modes compute only what is still referenced):
- tiny: one cached op (`a + b`, 4 elements): per-op overhead, timed over 1000 ops per call (for
  the compile backend, a compiled `torch.add`: its per-call overhead);
- llama_block: a Llama block (d 256, 8 heads, 4 KV heads, SwiGLU 688; attention written out, as
  TorchTPU's SDPA is a TPU-only kernel), batch 2 x 64, inference;
- rounds: 50 rounds of add, mul and sub on 1000 x 1000 f32;
- mlp_step: a training step of an MLP (256 -> 512 -> 256, batch 64, AdamW), loss read.

Each system runs in its own worker process (tpuc and TorchTPU both take PyTorch's PrivateUse1
device, so they cannot share one); the driver asks the workers in turn, in rotating order, for a
block of timed calls of each workload, so that a slow spell of this shared machine lands on all
of them alike. Reported: the median over rounds of each block's median call, and the ratios to
TorchTPU's modes and to tpuc's compile backend.

usage: bench_eager.py [--rounds 9] [--calls 5] [--workloads ...] [--systems ...] [--json OUT]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORKLOADS = ("tiny", "llama_block", "rounds", "mlp_step")
TPUC_SYSTEMS = ("cpu", "tpuc_strict", "tpuc_fused", "tpuc_compiled")
TORCHTPU_SYSTEMS = ("torchtpu_strict", "torchtpu_fused")
TORCHTPU_PYTHON = os.path.join(ROOT, ".venv-torchtpu", "bin", "python")
TINY_OPS = 1000
# The workers' own lines start with this (what the systems print themselves is skipped).
_MARK = "bench_eager:"


# ---------------------------------------------------------------- workers


def _manual_attention(q, k, v, is_causal=False, **_):
    import torch

    scores = q @ k.transpose(-2, -1) / (q.shape[-1] ** 0.5)
    if is_causal:
        seq = q.shape[-2]
        mask = torch.ones(seq, seq, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(dim=-1) @ v


class _System:
    """How a worker puts values on its device, runs a workload and waits for it."""

    def __init__(self, name):
        import torch

        self.name = name
        if name.startswith("torchtpu"):
            import torch_tpu
            from torch_tpu._internal.execution_mode import EagerMode, set_eager_mode

            torch_tpu._loader._init_device("tpu")
            self.device = "tpu"
            mode = EagerMode.DEFER_AND_FUSE if name.endswith("fused") else EagerMode.DEFER_NEVER
            self.mode = set_eager_mode(mode)
            self.mode.__enter__()
            self.sync = torch.accelerator.synchronize
        elif name.startswith("tpuc"):
            import tpuc  # noqa: F401 - the device

            self.device = "cpu" if name == "tpuc_compiled" else "tpuc"
            if name == "tpuc_fused":
                import tpuc.device
                tpuc.device.fused(True)
            self.sync = torch.tpuc.synchronize
        else:
            self.device = "cpu"
            self.sync = lambda: None

    def compiled(self, fn):
        import torch

        return torch.compile(fn, backend="tpuc") if self.name == "tpuc_compiled" else fn


def _workload(name, system):
    """A function running one call of the workload on the system."""
    import torch

    torch.manual_seed(0)
    device = system.device
    if name == "tiny":
        a, b = torch.ones(4, device=device), torch.ones(4, device=device)
        add = system.compiled(torch.add)

        def tiny():
            for _ in range(TINY_OPS):
                c = add(a, b)
            system.sync()  # with the last sum alive: it is computed
            return c

        return tiny
    if name == "llama_block":
        sys.path.insert(0, os.path.join(ROOT, "crates", "tpuc-python", "tests"))
        import models

        models.F.scaled_dot_product_attention = _manual_attention
        block = models.DecoderBlock(256, heads=8, kv_heads=4, hidden=688).eval().to(device)
        x = torch.randn(2, 64, 256, device=device)
        run = system.compiled(block)

        def llama_block():
            with torch.no_grad():
                y = run(x)
            system.sync()
            return y

        return llama_block
    if name == "rounds":
        x0 = torch.randn(1000, 1000, device=device)
        y = torch.full((1000, 1000), 0.5, device=device)

        def fifty_rounds(x):
            for _ in range(50):
                x = x + y
                x = x * y
                x = x - y
            return x

        run = system.compiled(fifty_rounds)

        def rounds():
            x = run(x0)
            system.sync()
            return x

        return rounds
    if name == "mlp_step":
        model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)).to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x, y = torch.randn(64, 256, device=device), torch.randn(64, 256, device=device)
        forward = system.compiled(lambda: torch.nn.functional.mse_loss(model(x), y))

        def mlp_step():
            loss = forward()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            return loss.item()

        return mlp_step
    raise SystemExit(f"bench_eager: unknown workload {name!r}")


def worker(system_name, names):
    """Builds the workloads, warms them up (compiles), then answers the driver: a line
    `<workload> <calls>` gets the seconds of each call as a JSON list."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    system = _System(system_name)
    calls = {name: _workload(name, system) for name in names}
    for call in calls.values():
        for _ in range(3):
            call()
    print(f"{_MARK} ready", flush=True)
    for line in sys.stdin:
        name, count = line.split()
        times = []
        for _ in range(int(count)):
            started = time.perf_counter()
            calls[name]()
            times.append(time.perf_counter() - started)
        print(f"{_MARK} {json.dumps(times)}", flush=True)


# ---------------------------------------------------------------- driver


def _start(system, names):
    python = TORCHTPU_PYTHON if system.startswith("torchtpu") else os.path.join(ROOT, ".venv", "bin", "python")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore")
    if system.startswith("torchtpu"):
        import glob

        plugin = glob.glob(os.path.join(ROOT, ".venv", "lib", "python3*", "site-packages", "fastatomstruct_xla_cpu",
                                        "libpjrt_cpu.so"))
        # Its venv sees tpuc's packages too: no autoload, which would give PrivateUse1 to tpuc (the
        # worker initialises TorchTPU itself).
        env.update(TPU_LIBRARY_PATH=plugin[0], TPU_SKIP_MDS_QUERY="1", TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    process = subprocess.Popen([python, os.path.abspath(__file__), "--worker", system, "--workloads", *names],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                               env=env, cwd=ROOT)
    if _reply(process) != "ready":
        raise SystemExit(f"bench_eager: the {system} worker did not start")
    return process


def _reply(process) -> str:
    """The worker's next line of its own."""
    while True:
        line = process.stdout.readline()
        if not line:
            raise SystemExit("bench_eager: a worker ended early (run it alone with --worker to see why)")
        if line.startswith(_MARK):
            return line[len(_MARK):].strip()


def _ask(process, name, calls):
    process.stdin.write(f"{name} {calls}\n")
    process.stdin.flush()
    return json.loads(_reply(process))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=5, help="timed calls per workload, system and round")
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--systems", nargs="+", default=None, choices=TPUC_SYSTEMS + TORCHTPU_SYSTEMS)
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.workloads)
    systems = args.systems or list(TPUC_SYSTEMS) + (list(TORCHTPU_SYSTEMS) if os.path.exists(TORCHTPU_PYTHON) else [])
    if not os.path.exists(TORCHTPU_PYTHON):
        print("bench_eager: TorchTPU is not set up (.venv-torchtpu); tools/bench_eager.sh installs it", file=sys.stderr)
    workers = {}
    for system in systems:
        print(f"starting {system} (compiles its workloads)...", file=sys.stderr, flush=True)
        workers[system] = _start(system, args.workloads)
    blocks = {(s, w): [] for s in systems for w in args.workloads}
    for round_number in range(args.rounds):
        order = systems[round_number % len(systems):] + systems[:round_number % len(systems)]
        for name in args.workloads:
            for system in order:
                blocks[(system, name)].append(statistics.median(_ask(workers[system], name, args.calls)))
        print(f"round {round_number + 1}/{args.rounds}", file=sys.stderr, flush=True)
    for process in workers.values():
        process.stdin.close()
        process.wait(timeout=60)
    figures = {}
    for name in args.workloads:
        scale = 1e6 / TINY_OPS if name == "tiny" else 1e3
        unit = "us per op" if name == "tiny" else "ms per call"
        print(f"\n{name} ({unit}; median over {args.rounds} rounds of each block's median)")
        figures[name] = {}
        for system in systems:
            value = statistics.median(blocks[(system, name)]) * scale
            figures[name][system] = value
            ratios = []
            for baseline in ("torchtpu_strict", "torchtpu_fused", "tpuc_compiled"):
                if baseline in systems and baseline != system:
                    # Same-round ratios, so drifts of the machine's speed cancel.
                    per_round = [a / b for a, b in zip(blocks[(system, name)], blocks[(baseline, name)])]
                    ratios.append(f"{statistics.median(per_round):.2f}x {baseline}")
            print(f"  {system:16s} {value:10.3f}   " + ", ".join(ratios))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(figures, out, indent=2)


if __name__ == "__main__":
    sys.exit(main())
