#!/usr/bin/env python3
"""Exports a 24-layer Llama-style model (core ATen) for the compile benchmark.

Usage: .venv/bin/python tools/gen_bench_model.py OUT.pt2 [layers [batch]]
The archive is not committed: it is large and a script makes it again in seconds.
"""
import os
import sys

import numpy as np
import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_lowering import LlamaBlock  # noqa: E402


class Llama(nn.Module):
    def __init__(self, layers, dim=64, seq=16):
        super().__init__()
        self.blocks = nn.ModuleList(
            [LlamaBlock(dim=dim, heads=4, kv_heads=2, hidden=128, seq=seq) for _ in range(layers)]
        )

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


def main():
    out = sys.argv[1]
    layers = int(sys.argv[2]) if len(sys.argv) > 2 else 24
    batch = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    torch.manual_seed(0)
    model = Llama(layers).eval()
    x = torch.randn(batch, 16, 64)
    with torch.no_grad():
        expected = model(x)
        ep = torch.export.export(model, (x,)).run_decompositions()
    torch.export.save(ep, out)
    stem = out[:-len(".pt2")] if out.endswith(".pt2") else out
    np.savez(stem + ".inputs.npz", x.numpy())
    np.savez(stem + ".expected.npz", expected.numpy())
    print(f"{out}: {len(ep.graph.nodes)} nodes")


if __name__ == "__main__":
    main()
