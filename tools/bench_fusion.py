#!/usr/bin/env python3
"""Compile and steady-state times with the fusion stage off and on (`tpuc run --fusion none`
against `--fusion patterns` and `--fusion kernels`), measured in one run, interleaved round by round, the compiled-
executable cache off: testdata's Llama block and the 24-layer Llama-style model of
gen_bench_model.py. Reported per model: the median over rounds of tpuc's lowering, XLA's
compile and the median repeated run, and the ratio of each choice to fusion off.

usage: bench_fusion.py [--rounds 5] [--repeat 200]
Run on an idle machine.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from run_timing import ROOT, measure  # noqa: E402

CHOICES = ("none", "patterns", "kernels")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tpuc-bench-fusion-") as tmp:
        models = {"llama_block": os.path.join(ROOT, "testdata", "lowering", "llama_block.pt2"),
                  "llama24": os.path.join(tmp, "llama24.pt2")}
        subprocess.run([sys.executable, os.path.join(HERE, "gen_bench_model.py"), models["llama24"], "24"],
                       check=True, capture_output=True, text=True)
        times = {(m, c): [] for m in models for c in CHOICES}
        for r in range(args.rounds):
            for model, path in models.items():
                for choice in CHOICES:
                    times[(model, choice)].append(
                        measure(path, args.repeat, os.path.join(tmp, "out"), "--fusion", choice))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    print(f"median of {args.rounds} rounds (ms)")
    print(f"{'':24} {'lower':>8} {'compile':>8} {'steady':>8}")
    for model in models:
        medians = {c: [statistics.median(t[i] for t in times[(model, c)]) for i in range(3)] for c in CHOICES}
        for choice in CHOICES:
            lower, compile_ms, steady = medians[choice]
            print(f"{model + ' ' + choice:24} {lower:8.1f} {compile_ms:8.1f} {steady:8.3f}")
        for choice in CHOICES[1:]:
            ratios = [on / off for on, off in zip(medians[choice], medians["none"])]
            print(f"{model + ' ' + choice + '/none':24} {ratios[0]:8.2f} {ratios[1]:8.2f} {ratios[2]:8.2f}")


if __name__ == "__main__":
    main()
