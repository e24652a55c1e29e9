#!/usr/bin/env python3
"""First-call time of tpuc's compile backend, each measurement in a fresh process with an empty
cache of compiled executables (TPUC_CACHE_DIR in a new directory):

- training: the first training step of a Llama decoder block (batch 2, seq 64, hidden 128):
  forward, loss, backward and an SGD step, under torch.compile(backend="tpuc");
- decode: a bucketed decode loop, attention over a key/value cache growing by one token per
  step from 8 to `--tokens` (dynamic sizes, compiled per bucket of sizes), timed in full.

Each row gives the seconds of the first run, the seconds the backend spent compiling in the
foreground (waiting for an executable) and how many executables it compiled. With --repeat N the
measurements alternate between the systems given (--builds: paths of tpuc packages to put first
on sys.path, e.g. a copy of an earlier build) so that a slow spell of the machine lands on all.
Run on an idle machine.

usage: bench_first_call.py [--cases training decode] [--tokens 200] [--repeat 3]
                           [--builds PATH ...] [--json OUT]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "crates", "tpuc-python", "tests"))


def training() -> float:
    import torch
    from models import DecoderBlock

    torch.manual_seed(0)
    block = DecoderBlock(128, heads=4, kv_heads=2, hidden=344)
    optimizer = torch.optim.SGD(block.parameters(), lr=1e-3)
    step_fn = torch.compile(block, backend="tpuc")
    x = torch.randn(2, 64, 128)
    start = time.perf_counter()
    loss = step_fn(x).square().mean()
    loss.backward()
    optimizer.step()
    return time.perf_counter() - start


def decode_step():
    """The decode step (attention over a key/value cache, then a projection) compiled with
    tpuc, and its first query, keys and values (a cache of 8)."""
    import torch

    torch.manual_seed(0)
    heads, dim = 4, 32
    proj = torch.nn.Linear(heads * dim, heads * dim)

    def step(q, keys, values):
        scores = torch.einsum("hd,hsd->hs", q, keys) / dim ** 0.5
        out = torch.einsum("hs,hsd->hd", scores.softmax(-1), values)
        return proj(out.reshape(1, heads * dim)).reshape(heads, dim)

    compiled = torch.compile(step, backend="tpuc")
    keys, values = torch.randn(heads, 8, dim), torch.randn(heads, 8, dim)
    q = torch.randn(heads, dim)
    return compiled, q, keys, values


def grow(compiled, q, keys, values):
    """One decode step: the cache grows by the step's output (its length marked dynamic, as
    automatic dynamic shapes would find after a step)."""
    import torch

    torch._dynamo.mark_dynamic(keys, 1)
    torch._dynamo.mark_dynamic(values, 1)
    q = compiled(q, keys, values)
    return q, torch.cat([keys, q[:, None]], dim=1), torch.cat([values, q[:, None]], dim=1)


def decode(tokens: int) -> float:
    import torch

    compiled, q, keys, values = decode_step()
    start = time.perf_counter()
    with torch.no_grad():
        while keys.shape[1] < tokens:
            q, keys, values = grow(compiled, q, keys, values)
    return time.perf_counter() - start


def worker(case: str, tokens: int) -> dict:
    from tpuc.runtime import STATS

    seconds = training() if case == "training" else decode(tokens)
    return {"seconds": seconds, "compiles": STATS["compiles"],
            "compile_wait_s": STATS.get("compile_seconds")}


def measure(case: str, build: str | None, tokens: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="tpuc-first-call-") as cache:
        env = dict(os.environ, TPUC_CACHE_DIR=cache, TF_CPP_MIN_LOG_LEVEL="3")
        if build:
            env["PYTHONPATH"] = build + os.pathsep + env.get("PYTHONPATH", "")
        out = subprocess.run([sys.executable, __file__, "--worker", case, str(tokens)], capture_output=True,
                             text=True, env=env, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"{case} ({build or 'this build'}) failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=["training", "decode"], choices=["training", "decode"])
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--builds", nargs="+", default=[""],
                        help="tpuc packages to compare (a directory holding a `tpuc` package; '' for this build)")
    parser.add_argument("--json")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker[0], int(args.worker[1]))))
        return
    rows = []
    for case in args.cases:
        runs = {build: [] for build in args.builds}
        for _ in range(args.repeat):
            for build in args.builds:
                runs[build].append(measure(case, build or None, args.tokens))
        for build, found in runs.items():
            seconds = [r["seconds"] for r in found]
            row = {"case": case, "build": build or "this build", "median_s": statistics.median(seconds),
                   "runs_s": seconds, "compiles": found[0]["compiles"]}
            rows.append(row)
            print(f"{case:9} {row['build']:24} first run {row['median_s']:7.2f} s (runs: "
                  f"{', '.join(f'{s:.2f}' for s in seconds)}), {row['compiles']} executables", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
