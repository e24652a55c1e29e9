#!/usr/bin/env python3
"""Sharding benchmark: the 24-layer Llama-style model (batch 4) compiled under each plan against
unsharded (`tpuc compile`, whole processes, interleaved rounds), and its steady-state run time on
one device against two and four CPU devices under each plan (`tpuc run --repeat`). The CPU plugin
splits the host's cores between its devices: on a 2-core machine this shows the partitioner's
overheads, not a speed-up. Run on an idle machine, after `cargo build --release -p tpuc-cli`.

Usage: .venv/bin/python tools/bench_sharding.py [--rounds N] [--repeat N]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "target", "bench", "llama24_b4.pt2")
TPUC = os.path.join(ROOT, "target", "release", "tpuc")
LAYOUTS = [
    ("unsharded", None, None),
    ("dp", "dp=2", "dp"),
    ("fsdp", "fsdp=2", "fsdp"),
    ("tp", "tp=2", "tp"),
    ("fsdp,tp", "fsdp=2,tp=2", "fsdp,tp"),
]


def layout_args(mesh, plan):
    return [] if mesh is None else ["--mesh", mesh, "--plan", plan]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="compile rounds per layout")
    parser.add_argument("--repeat", type=int, default=30, help="steady-state runs per layout")
    args = parser.parse_args()
    if not os.path.exists(TPUC):
        sys.exit(f"{TPUC} is missing: cargo build --release -p tpuc-cli")
    if not os.path.exists(MODEL):
        os.makedirs(os.path.dirname(MODEL), exist_ok=True)
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gen_bench_model.py"), MODEL, "24", "4"],
                       check=True)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    times = {name: [] for name, _, _ in LAYOUTS}
    for r in range(args.rounds):
        order = LAYOUTS if r % 2 == 0 else LAYOUTS[::-1]
        for name, mesh, plan in order:
            start = time.perf_counter()
            subprocess.run([TPUC, "compile", MODEL, "-o", os.devnull, *layout_args(mesh, plan)], check=True, env=env)
            times[name].append(time.perf_counter() - start)
    base = statistics.median(times["unsharded"])
    print(f"tpuc compile of {os.path.basename(MODEL)} (whole process, median of {args.rounds} interleaved rounds)")
    for name, mesh, _ in LAYOUTS:
        median = statistics.median(times[name])
        print(f"  {name:10} {mesh or '1 device':12} {median * 1e3:8.1f} ms  {median / base:5.2f}x unsharded")
    print(f"tpuc run, steady state (median of {args.repeat} runs after the first; compile cache off)")
    inputs = MODEL[: -len(".pt2")] + ".inputs.npz"
    steady = {}
    for name, mesh, plan in LAYOUTS:
        run = subprocess.run(
            [TPUC, "run", MODEL, "--input", inputs, "--out", os.path.join(ROOT, "target", "bench", "out"),
             "--cache-dir", "off", "--repeat", str(args.repeat), *layout_args(mesh, plan)],
            capture_output=True, text=True, env=env,
        )
        if run.returncode != 0:
            print(f"  {name:10} FAILED: {run.stderr.strip()[-300:]}")
            continue
        found = re.search(r"median ([0-9.]+) ms, fastest ([0-9.]+) ms", run.stderr)
        steady[name] = float(found.group(1))
        ratio = steady[name] / steady["unsharded"] if "unsharded" in steady else float("nan")
        print(f"  {name:10} {mesh or '1 device':12} {steady[name]:8.3f} ms  {ratio:5.2f}x one device"
              f"  (fastest {found.group(2)} ms)")


if __name__ == "__main__":
    main()
