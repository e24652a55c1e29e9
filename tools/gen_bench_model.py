#!/usr/bin/env python3
"""Exports a 24-layer Llama-style model (core ATen) for the compile benchmark.

Usage: .venv/bin/python tools/gen_bench_model.py OUT.pt2 [layers [batch]] [--captured]
--captured runs each block through torch.compiler.nested_compile_region and exports with
Dynamo (strict), so the archive holds the block once (invoke_subgraph) instead of inlined.
The archive is not committed: it is large and a script makes it again in seconds.
"""
import os
import sys

import numpy as np
import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_lowering import LlamaBlock  # noqa: E402


@torch.compiler.nested_compile_region
def captured(block, x):
    return block(x)


class Llama(nn.Module):
    def __init__(self, layers, dim=64, seq=16, capture=False):
        super().__init__()
        self.blocks = nn.ModuleList(
            [LlamaBlock(dim=dim, heads=4, kv_heads=2, hidden=128, seq=seq) for _ in range(layers)]
        )
        self.capture = capture

    def forward(self, x):
        for b in self.blocks:
            x = captured(b, x) if self.capture else b(x)
        return x


def main():
    capture = "--captured" in sys.argv
    args = [a for a in sys.argv[1:] if a != "--captured"]
    out = args[0]
    layers = int(args[1]) if len(args) > 1 else 24
    batch = int(args[2]) if len(args) > 2 else 1
    torch.manual_seed(0)
    model = Llama(layers, capture=capture).eval()
    x = torch.randn(batch, 16, 64)
    with torch.no_grad():
        expected = model(x)
        ep = torch.export.export(model, (x,), strict=capture).run_decompositions()
    torch.export.save(ep, out)
    stem = out[:-len(".pt2")] if out.endswith(".pt2") else out
    np.savez(stem + ".inputs.npz", x.numpy())
    np.savez(stem + ".expected.npz", expected.numpy())
    print(f"{out}: {len(ep.graph.nodes)} nodes")


if __name__ == "__main__":
    main()
