#!/usr/bin/env python3
"""Steady-state times of tpuc against other builds of it, measured in one run: each measurement
in a process of its own, the builds alternating round by round, so that a slow spell of the
machine lands on all of them. Reported: the median over rounds, and each build's ratio to the
first build given (the installed one unless --builds names others first).

- tiny: one call of a compiled Linear(8, 8) + ReLU under torch.compile(backend="tpuc") (the
  per-call overhead), with inductor's beside it (measured in the first build's processes);
- llama_block: one call of a compiled Llama decoder block (batch 1, seq 128, hidden 256);
- decode: one step of a bucketed decode loop (a key/value cache growing by one token a step,
  dynamic sizes compiled per bucket), after its buckets compiled;
- tpuc_run: `tpuc run --repeat 200` of the 24-layer Llama-style model of tools/gen_bench_model.py
  (the median repeated run, as the command reports it).

Torch runs on one thread. Run on an idle machine.

usage: bench_steady.py [--builds PATH ...] [--cases tiny llama_block decode tpuc_run]
                       [--rounds 5] [--json OUT]
A build is a directory holding a `tpuc` package and its extension (`pip install --target DIR
dist/tpuc-*.whl`), put first on sys.path; `installed` is the package of .venv.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CASES = ("tiny", "llama_block", "decode", "tpuc_run")


def per_call(fn, calls: int, blocks: int = 7) -> float:
    """The median over blocks of the mean seconds per call."""
    for _ in range(max(calls // 10, 3)):
        fn()
    times = []
    for _ in range(blocks):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times)


def tiny(backend: str) -> float:
    import torch
    from bench_backend import build

    model, (x,) = build("tiny")
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        compiled(x)
        return per_call(lambda: compiled(x), 5000)


def llama_block() -> float:
    import torch
    from bench_backend import build

    block, (x,) = build("llama_block")
    compiled = torch.compile(block, backend="tpuc")
    with torch.no_grad():
        compiled(x)
        return per_call(lambda: compiled(x), 50)


def decode() -> float:
    import torch
    from bench_first_call import decode_step, grow

    compiled, q, keys, values = decode_step()
    with torch.no_grad():
        # Grow through the first buckets (compiling them), then time steps within one.
        for _ in range(100):
            q, keys, values = grow(compiled, q, keys, values)
        return per_call(lambda: compiled(q, keys, values), 300)


def tpuc_run(model: str) -> float:
    """`tpuc run` of the build on sys.path (its own `tpuc_command`), in a child process."""
    out = tempfile.mkdtemp()
    args = ["run", model, "--input", model[: -len(".pt2")] + ".inputs.npz", "--out", out,
            "--repeat", "200", "--cache-dir", "off"]
    stderr = subprocess.run([sys.executable, "-c", "import sys, tpuc_command; sys.argv[0] = 'tpuc'; "
                             "sys.exit(tpuc_command.main())", *args],
                            capture_output=True, text=True, check=True).stderr
    found = re.search(r"then 200 more: median ([0-9.]+) ms", stderr)
    if not found:
        raise SystemExit(f"no steady time in tpuc run's output:\n{stderr}")
    return float(found.group(1)) / 1e3


def measure(case: str, backend: str, model: str) -> float:
    import torch

    torch.set_num_threads(1)
    if case == "tiny":
        return tiny(backend)
    if case == "llama_block":
        return llama_block()
    if case == "decode":
        return decode()
    return tpuc_run(model)


def run_child(build: str, case: str, backend: str, model: str) -> float:
    env = dict(os.environ, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="3",
               TPUC_CACHE_DIR=tempfile.mkdtemp())
    if build != "installed":
        env["PYTHONPATH"] = os.path.abspath(build)
    code = ("import sys; sys.path.insert(0, %r); import bench_steady as b; "
            "print(b.measure(%r, %r, %r))" % (HERE, case, backend, model))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{build} {case}: {out.stderr[-3000:]}")
    return float(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--builds", nargs="+", default=["installed"])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args()
    model = os.path.join(ROOT, "target", "bench", "llama24.pt2")
    if "tpuc_run" in args.cases and not os.path.exists(model):
        os.makedirs(os.path.dirname(model), exist_ok=True)
        subprocess.run([sys.executable, os.path.join(HERE, "gen_bench_model.py"), model, "24"], check=True)
    systems = [(b, "tpuc") for b in args.builds]
    results = {}
    for case in args.cases:
        rows = systems + ([(args.builds[0], "inductor")] if case == "tiny" else [])
        times = {row: [] for row in rows}
        for round_ in range(args.rounds):
            # Rotate the order each round.
            order = rows[round_ % len(rows):] + rows[: round_ % len(rows)]
            for row in order:
                times[row].append(run_child(row[0], case, row[1], model))
            print(f"[bench] {case}: round {round_ + 1} of {args.rounds}", file=sys.stderr)
        base = statistics.median(times[rows[0]])
        for (build, backend), ts in times.items():
            median = statistics.median(ts)
            unit, scale = ("us", 1e6) if case == "tiny" else ("ms", 1e3)
            print(f"{case:12s} {backend:9s} {build:40s} {median * scale:9.2f} {unit}  "
                  f"{median / base:5.2f}x  (range {min(ts) * scale:.2f}-{max(ts) * scale:.2f})")
            results[f"{case}/{backend}/{build}"] = ts
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
