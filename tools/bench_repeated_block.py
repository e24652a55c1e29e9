#!/usr/bin/env python3
"""Compile and steady-state times of the 24-layer Llama-style model of gen_bench_model.py, its
block captured once (torch.compiler.nested_compile_region: one function, called per layer)
against inlined (every layer's ops written out), measured in one run: `tpuc run --repeat` of
each archive in turn, round after round, the compiled-executable cache off. Reported per
archive: the median over rounds of tpuc's lowering, XLA's compile and the median repeated run,
each as `tpuc run` prints it, and the captured archive's ratio to the inlined one.

usage: bench_repeated_block.py [--layers 24] [--rounds 5] [--repeat 100]
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
from run_timing import measure  # noqa: E402


def export(path: str, layers: int, captured: bool) -> None:
    flags = ["--captured"] if captured else []
    subprocess.run([sys.executable, os.path.join(HERE, "gen_bench_model.py"), path, str(layers), *flags],
                   check=True, capture_output=True, text=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tpuc-bench-block-") as tmp:
        paths = {kind: os.path.join(tmp, f"{kind}.pt2") for kind in ("inlined", "captured")}
        for kind, path in paths.items():
            export(path, args.layers, kind == "captured")
        times: dict[str, list[tuple[float, float, float]]] = {kind: [] for kind in paths}
        for r in range(args.rounds):
            for kind, path in paths.items():
                times[kind].append(measure(path, args.repeat, os.path.join(tmp, "out")))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    medians = {kind: [statistics.median(t[i] for t in runs) for i in range(3)] for kind, runs in times.items()}
    print(f"{args.layers} layers, median of {args.rounds} rounds (ms)")
    print(f"{'':10} {'lower':>8} {'compile':>8} {'steady':>8}")
    for kind, (lower, compile_ms, steady) in medians.items():
        print(f"{kind:10} {lower:8.1f} {compile_ms:8.1f} {steady:8.3f}")
    ratios = [c / i for c, i in zip(medians["captured"], medians["inlined"])]
    print(f"{'ratio':10} {ratios[0]:8.2f} {ratios[1]:8.2f} {ratios[2]:8.2f}  (captured / inlined)")


if __name__ == "__main__":
    main()
