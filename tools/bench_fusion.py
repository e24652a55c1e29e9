#!/usr/bin/env python3
"""Compile and steady-state times with the fusion stage off and on (`tpuc run --fusion none`
against `--fusion patterns` and `--fusion kernels`), measured in one run, interleaved round by round, the compiled-
executable cache off: testdata's Llama block, the 24-layer Llama-style model of
gen_bench_model.py, causal grouped-query attention over 2048 positions (where `kernels`
computes it in blocks of keys) and causal attention written out over 512 positions (where
`kernels` computes the mask from positions). Reported per model: the median over rounds of tpuc's lowering,
XLA's compile and the median repeated run, XLA's temporaries, and the ratio of each choice to
fusion off.

usage: bench_fusion.py [--rounds 5] [--repeat 200] [--models llama_block,llama24,attention2048,written512]
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


def export_attention(path: str, positions: int) -> None:
    """Causal attention of 8 query heads over 2 key/value heads (repeated by the model), 64
    wide, over `positions`."""
    import torch

    class Attention(torch.nn.Module):
        def forward(self, q, k, v):
            k, v = (t.repeat_interleave(4, dim=1) for t in (k, v))
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    torch.manual_seed(0)
    save(Attention(), (torch.randn(1, 8, positions, 64), torch.randn(1, 2, positions, 64),
                       torch.randn(1, 2, positions, 64)), path)


def export_written_attention(path: str, positions: int) -> None:
    """Causal attention of 8 heads, 64 wide, over `positions`, written out as minGPT writes it
    (a boolean mask made in the graph, `-inf` filled, softmax, values)."""
    import torch

    class Attention(torch.nn.Module):
        def forward(self, q, k, v):
            hidden = torch.ones(positions, positions, dtype=torch.bool).triu(1)
            scores = (q @ k.transpose(-2, -1)) / 8.0
            return scores.masked_fill(hidden, float("-inf")).softmax(-1) @ v

    torch.manual_seed(0)
    save(Attention(), tuple(torch.randn(1, 8, positions, 64) for _ in range(3)), path)


def save(model, inputs, path: str) -> None:
    """`model` exported as an archive, its inputs and torch's outputs beside it."""
    import numpy as np
    import torch

    with torch.no_grad():
        want = model(*inputs)
    torch.export.save(torch.export.export(model, inputs), path)
    stem = path[:-len(".pt2")]
    np.savez(stem + ".inputs.npz", *[t.numpy() for t in inputs])
    np.savez(stem + ".expected.npz", want.numpy())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--models", default="llama_block,llama24,attention2048")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tpuc-bench-fusion-") as tmp:
        models = {"llama_block": os.path.join(ROOT, "testdata", "lowering", "llama_block.pt2"),
                  "llama24": os.path.join(tmp, "llama24.pt2"), "attention2048": os.path.join(tmp, "attention.pt2"),
                  "written512": os.path.join(tmp, "written512.pt2")}
        models = {m: p for m, p in models.items() if m in args.models.split(",")}
        if "llama24" in models:
            subprocess.run([sys.executable, os.path.join(HERE, "gen_bench_model.py"), models["llama24"], "24"],
                           check=True, capture_output=True, text=True)
        if "attention2048" in models:
            export_attention(models["attention2048"], 2048)
        if "written512" in models:
            export_written_attention(models["written512"], 512)
        times = {(m, c): [] for m in models for c in CHOICES}
        for r in range(args.rounds):
            for model, path in models.items():
                for choice in CHOICES:
                    times[(model, choice)].append(
                        measure(path, args.repeat, os.path.join(tmp, "out"), "--fusion", choice))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    print(f"median of {args.rounds} rounds (ms; temporaries in MiB)")
    print(f"{'':28} {'lower':>8} {'compile':>8} {'steady':>8} {'temps':>8}")
    for model in models:
        medians = {c: [statistics.median(t[i] for t in times[(model, c)]) for i in range(4)] for c in CHOICES}
        for choice in CHOICES:
            lower, compile_ms, steady, temporaries = medians[choice]
            print(f"{model + ' ' + choice:28} {lower:8.1f} {compile_ms:8.1f} {steady:8.3f} {temporaries:8.1f}")
        for choice in CHOICES[1:]:
            ratios = [on / off for on, off in zip(medians[choice], medians["none"])]
            print(f"{model + ' ' + choice + '/none':28} " + " ".join(f"{r:8.2f}" for r in ratios))


if __name__ == "__main__":
    main()
