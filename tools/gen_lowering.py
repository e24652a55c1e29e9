#!/usr/bin/env python3
"""Builds the golden lowering inputs: small torch programs exported with torch.export.

For each case it writes, under testdata/lowering/:
  <case>.pt2            the torch.export archive (raw export, or "<case>_core" after
                        run_decompositions(), i.e. core ATen)
  <case>.inputs.npz     example inputs (seeded), and
  <case>.expected.npz   torch eager outputs for those inputs.
The expected StableHLO (<case>.mlir) is written by `TPUC_BLESS=1 cargo test`.

Usage: .venv/bin/python tools/gen_lowering.py [case ...]
"""
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "testdata", "lowering")


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 8)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim) + 0.1 * torch.randn(dim))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rope(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return x * cos + rotated * sin


class LlamaBlock(nn.Module):
    """RMSNorm, rotary embedding, grouped-query causal attention, SwiGLU."""

    def __init__(self, dim=32, heads=4, kv_heads=2, hidden=64, seq=8):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.norm1, self.norm2 = RMSNorm(dim), RMSNorm(dim)
        self.wq = nn.Linear(dim, heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(heads * self.head_dim, dim, bias=False)
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        pos = torch.arange(seq, dtype=torch.float32)[:, None]
        freq = 1.0 / (10000 ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim))
        ang = torch.cat([pos * freq, pos * freq], dim=-1)
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)

    def forward(self, x):
        b, s, d = x.shape
        h = self.norm1(x)
        q = self.wq(h).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.wk(h).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(h).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rope(q, self.cos, self.sin), rope(k, self.cos, self.sin)
        rep = self.heads // self.kv_heads
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(a.transpose(1, 2).reshape(b, s, d))
        h = self.norm2(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class ResNetCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(3, stride=2, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.conv3 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn3 = nn.BatchNorm2d(8)
        self.avg = nn.AvgPool2d(2)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 10)
        for bn in (self.bn1, self.bn2, self.bn3):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 1.5)
            bn.weight.data.uniform_(0.5, 1.5)
            bn.bias.data.uniform_(-0.5, 0.5)

    def forward(self, x):
        x = self.pool(F.relu(self.bn1(self.conv1(x))))
        y = F.relu(self.bn2(self.conv2(x)))
        x = F.relu(x + self.bn3(self.conv3(y)))
        x = self.gap(self.avg(x))
        return self.fc(torch.flatten(x, 1))


class NormGeluSoftmax(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(16)
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 16)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        h = self.drop(F.gelu(self.fc1(self.ln(x))))
        h2 = F.gelu(self.fc1(x), approximate="tanh")
        return F.softmax(self.fc2(h + h2), dim=-1), F.log_softmax(self.fc2(h), dim=-1)


class Elementwise(nn.Module):
    def forward(self, x, y):
        return (
            torch.abs(x) + torch.exp(x * 0.5) - torch.log(torch.abs(y) + 1),
            torch.sqrt(torch.abs(x)) * torch.tanh(y) / (torch.sigmoid(x) + 1),
            torch.clamp(x, -0.5, 0.5),
            torch.where(x > y, x, y),
            torch.maximum(x, y) - torch.minimum(x, y),
            x.floor() + y.ceil() + x.round(),
            torch.sin(x) * torch.cos(y) + x ** 3,
            x / 0.0,  # +-inf and nan must come out as torch gives them
        )


class Reductions(nn.Module):
    def forward(self, x):
        return (
            x.sum(),
            x.sum(dim=1),
            x.mean(dim=(0, 2), keepdim=True),
            x.amax(dim=-1),
            x.amin(dim=0),
            x.max(dim=1).values,
            x.argmax(dim=2),
            x.var(dim=1, unbiased=True),
            x.prod(dim=2),
        )


class Broadcasting(nn.Module):
    def forward(self, a, b, c):
        return a + b, a * c, (a - b) * c + 2.0, b.expand(4, 3, 5) + 1


class DtypeMix(nn.Module):
    def forward(self, f, i, h, b):
        return (
            f + i,  # float32 + int64 -> float32
            i * 3,  # int64
            i + 2.5,  # int64 + python float -> float32
            h + f,  # float16 + float32 -> float32
            (i > 2) & b,  # bool
            h * 2,  # float16
            i // 3,
            i % 3,
            f.to(torch.bfloat16) * 2,
            i.to(torch.int32) + 1,
            b.to(torch.float32) + f,
            (i.to(torch.uint8) + 1).to(torch.int8),
            f.double() * 2,
        )


class Indexing(nn.Module):
    def forward(self, x, idx):
        return (
            x[:, 1:3],
            x[idx],
            torch.gather(x, 1, idx.view(-1, 1).expand(-1, 4) % 4),
            torch.index_select(x, 0, idx),
            x[1],
            x[..., ::2],
            x.narrow(1, 1, 2),
        )


class MultiOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, x):
        h = self.lin(x)
        a, b, c = h.split(2, dim=-1)
        return a, b * 2, torch.stack([a, c], dim=0), h.t()


class Conv1dPool(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(4, 6, 3, padding=2, dilation=2, groups=2)

    def forward(self, x):
        y = F.max_pool1d(self.conv(x), 2)
        return F.avg_pool1d(y, 3, stride=1, padding=1), F.adaptive_avg_pool1d(y, 2)


class Embedding(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 8)

    def forward(self, ids):
        e = self.emb(ids)
        return e.mean(1), e.permute(2, 0, 1).contiguous(), torch.cumsum(e, dim=1)


class ScatterOps(nn.Module):
    """Ops that write into tensors or build them from parts: transposed convolution, embedding
    bags, index_put (accumulating), slice/select assignment, in-place ops, triangles, masks."""

    def __init__(self):
        super().__init__()
        self.up = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2)
        self.bag_sum = nn.EmbeddingBag(12, 3, mode="sum")
        self.bag_mean = nn.EmbeddingBag(12, 3, mode="mean", padding_idx=0)

    def forward(self, image, tokens, offsets, x):
        up = self.up(image)
        weights = torch.linspace(0.5, 2.0, tokens.shape[0])
        summed = self.bag_sum(tokens, offsets, per_sample_weights=weights)
        mean = self.bag_mean(tokens, offsets)
        counts = torch.zeros(12).index_put((tokens,), torch.ones(tokens.shape[0]), accumulate=True)
        y = x.clone() - 0.25
        y.relu_()
        y.add_(x)
        tri = torch.tril(x, diagonal=1) + torch.triu(x, diagonal=2)
        masked = x.masked_fill(x > 0.5, float("-inf"))
        outer = torch.outer(x[0], x[1])
        powers = 2.0 ** x
        pairs = torch.triu_indices(4, 4, offset=1)
        return up, summed, mean, counts, y, tri, masked, outer, powers, pairs


class Spectral(nn.Module):
    """FFTs and complex arithmetic: a learned filter applied in the frequency domain."""

    def __init__(self):
        super().__init__()
        self.gain = nn.Parameter(torch.linspace(1.0, 0.0, 9))

    def forward(self, x):
        spec = torch.fft.rfft(x, norm="ortho")
        filtered = torch.fft.irfft(spec * self.gain, n=16, norm="ortho")
        grid = torch.fft.fft2(x.reshape(2, 4, 4))
        return filtered, torch.view_as_real(grid), spec.abs(), spec.angle(), torch.fft.ihfft(x)


class ComplexExp(nn.Module):
    """exp of a complex tensor, which tpuc does not compute: refused, not miscomputed."""

    def forward(self, x):
        return torch.view_as_real(torch.fft.fft(x).exp())


class Unsupported(nn.Module):
    """Ops tpuc does not lower yet: `tpuc compile` must name every one in a single error."""

    def forward(self, x):
        return torch.special.i0(x) + torch.cdist(x, x).sum(), torch.special.i0(x * 2)


class Branches(nn.Module):
    """torch.cond on tensors' values, twice so that both branches run: several operands (a
    weight among them), branches returning several tensors."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        def wide(x, w):
            return x @ w, x.sum(0)

        def narrow(x, w):
            return x - 1.0, x.amax(0) * w[0]

        first = torch.cond(x.sum() > 0, wide, narrow, (x, self.w))
        second = torch.cond(x.sum() <= 0, wide, narrow, (x, self.w))
        return (*first, *second)


class Loop(nn.Module):
    """while_loop: an integer counter, a float state of another shape, and tensors of the
    enclosing graph the condition and body read (its additional inputs)."""

    def forward(self, x, steps):
        from torch._higher_order_ops.while_loop import while_loop

        def cond(i, state, total):
            return i < steps

        def body(i, state, total):
            state = state * 0.5 + x
            return i + 1, state, total + state.sum()

        return while_loop(cond, body, (torch.zeros((), dtype=torch.int64), torch.zeros_like(x), x.sum() * 0))


class Rnn(nn.Module):
    """An RNN written with scan, forward and reverse: a carried hidden state, the step's outputs
    stacked, the weights read from the enclosing graph."""

    def __init__(self):
        super().__init__()
        self.w_in = nn.Parameter(torch.randn(3, 4) * 0.5)
        self.w_h = nn.Parameter(torch.randn(4, 4) * 0.5)

    def forward(self, xs, h):
        from torch._higher_order_ops.scan import scan

        def step(h, x):
            h = torch.tanh(x @ self.w_in + h @ self.w_h)
            return h, h.sum(-1)

        last, sums = scan(step, h, xs)
        first, states = scan(lambda h, x: (h + x @ self.w_in, h.clone()), h, xs, reverse=True)
        return last, sums, first, states


class BatchFirstRnn(Rnn):
    """The RNN's step over batch-first inputs (batch, steps, features): the last state and the
    per-step sums (batch, steps)."""

    def forward(self, xs, h):
        from torch._higher_order_ops.scan import scan

        def step(h, x):
            h = torch.tanh(x @ self.w_in + h @ self.w_h)
            return h, h.sum(-1)

        last, sums = scan(step, h, xs.movedim(1, 0))
        return last, sums.movedim(0, 1)


class MapRows(nn.Module):
    """map over the rows of a tensor, with an input read by every row."""

    def forward(self, xs, y):
        from torch._higher_order_ops.map import map as map_rows

        return map_rows(lambda x, y: (x * y + 1, x.amax()), xs, y)


class PrefixScan(nn.Module):
    """associative_scan: running sums along one dimension, and a first-order linear recurrence
    (pairs combined as affine maps) along another, with a scale read from the enclosing graph."""

    def forward(self, x, a, b):
        from torch._higher_order_ops.associative_scan import associative_scan

        sums = associative_scan(lambda u, v: u + v, x, dim=1, combine_mode="pointwise")
        scale = x.amax()

        def affine(left, right):
            return left[0] * right[0], (left[1] * right[0] + right[1]) * scale / scale

        gains, states = associative_scan(affine, (a, b), dim=0, combine_mode="pointwise")
        return sums, gains, states


@torch.compiler.nested_compile_region
def residual_block(x, w, b):
    return torch.relu(x @ w + b) + x


class RepeatedBlocks(nn.Module):
    """A block repeated with its own weights, captured once (torch.compiler.nested_compile_region):
    invoke_subgraph, one function for its calls."""

    strict_export = True

    def __init__(self, layers=4):
        super().__init__()
        self.ws = nn.ParameterList([nn.Parameter(torch.randn(6, 6) * 0.4) for _ in range(layers)])
        self.bs = nn.ParameterList([nn.Parameter(torch.randn(6) * 0.1) for _ in range(layers)])

    def forward(self, x):
        for w, b in zip(self.ws, self.bs):
            x = residual_block(x, w, b)
        return x


def seeded(*shape, dtype=torch.float32, lo=None, hi=None):
    if dtype.is_floating_point:
        return torch.randn(*shape).to(dtype)
    if dtype == torch.bool:
        return torch.rand(*shape) > 0.5
    return torch.randint(lo if lo is not None else -5, hi or 10, shape, dtype=dtype)


def cases():
    torch.manual_seed(0)
    yield "mlp", MLP(), (seeded(4, 16),)
    yield "llama_block", LlamaBlock(), (seeded(2, 8, 32),)
    yield "resnet_cnn", ResNetCNN(), (seeded(2, 3, 16, 16),)
    yield "norm_gelu_softmax", NormGeluSoftmax(), (seeded(3, 16),)
    yield "elementwise", Elementwise(), (seeded(3, 5), seeded(3, 5))
    yield "reductions", Reductions(), (seeded(3, 4, 5),)
    yield "broadcasting", Broadcasting(), (seeded(4, 3, 5), seeded(3, 1), seeded(5))
    yield "dtype_mix", DtypeMix(), (
        seeded(2, 3),
        seeded(2, 3, dtype=torch.int64),
        seeded(2, 3, dtype=torch.float16),
        seeded(2, 3, dtype=torch.bool),
    )
    yield "indexing", Indexing(), (seeded(5, 4), torch.tensor([4, 0, 2], dtype=torch.int64))
    yield "multi_out", MultiOut(), (seeded(3, 6),)
    yield "conv1d_pool", Conv1dPool(), (seeded(2, 4, 12),)
    yield "embedding", Embedding(), (torch.randint(0, 20, (2, 5)),)
    yield "scatter_ops", ScatterOps(), (
        seeded(1, 4, 5, 5),
        torch.tensor([3, 0, 7, 7, 11, 2, 0, 5]),
        torch.tensor([0, 3, 3, 6]),
        seeded(4, 6),
    )
    yield "spectral", Spectral(), (seeded(2, 16),)
    yield "cond_branches", Branches(), (seeded(3, 4),)
    yield "while_loop", Loop(), (seeded(2, 3), torch.tensor(5))
    yield "scan_rnn", Rnn(), (seeded(5, 2, 3), seeded(2, 4))
    yield "map_rows", MapRows(), (seeded(4, 3), seeded(3))
    yield "invoke_subgraph", RepeatedBlocks(), (seeded(3, 6),)
    yield "associative_scan", PrefixScan(), (seeded(3, 6), seeded(5, 2), seeded(5, 2))
    # A batch of 8, which meshes of up to 8 devices split (testdata/lowering/sharded).
    yield "llama_block_batch8", LlamaBlock(), (seeded(8, 8, 32),)


class ViewMutation(nn.Module):
    """Assignment through a view: raw export keeps it as an in-place op on a slice."""

    def forward(self, x):
        y = x.clone()
        y[:, 1:3] = 0.0
        return y


class ValueSizedRow(nn.Module):
    """Reads a tensor's value as an index (`.item()`): export records a size only the data
    decides (u0) and assertions over it."""

    def forward(self, x, i):
        row = i.item()
        torch._check(row >= 0)
        torch._check(row < x.shape[0])
        return x[row] * 2


ERROR_CASES = {
    "unsupported": (Unsupported(), (torch.randn(3, 4),)),
    "value_sized": (ValueSizedRow(), (torch.randn(5, 3), torch.tensor(2))),
    "view_mutation": (ViewMutation(), (torch.randn(3, 4),)),
    "complex_exp": (ComplexExp(), (torch.randn(3, 4),)),
}


class DynamicShapes(nn.Module):
    """Exported with a dynamic batch and sequence length: sizes that are symbols, size
    arithmetic (products, floor division) feeding views and slices, a concatenation."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 8)

    def forward(self, x, y):
        batch, seq, _ = x.shape
        h = self.proj(x).reshape(batch, seq * 8)
        h = h[:, : (seq * 8) // 2] + 1
        return h, torch.cat([x, y], dim=1).sum(-1)


class PairFold(nn.Module):
    """Sums neighbouring pairs of an even-length sequence."""

    def forward(self, x):
        batch, seq, dim = x.shape
        return x.reshape(batch, seq // 2, 2 * dim).sum(1)


class DecodingStep(nn.Module):
    """A decoding step's shape: a cache of dynamic length grown by a projection of the new
    entry, attended over (a softmax over the cache), and the cache's mean."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(self, cache, new, q):
        keys = torch.cat([cache, self.proj(new)], dim=1)
        weights = (q @ keys.transpose(1, 2)).softmax(-1)
        return weights @ keys, keys.mean(1), keys


def dynamic_case():
    """testdata/lowering/dynamic/: the program (core ATen), and inputs with torch's outputs for
    the exported sizes and for two other sizes in range."""
    torch.manual_seed(0)
    model = DynamicShapes().eval()
    batch = torch.export.Dim("batch", min=2, max=64)
    seq = torch.export.Dim("seq", min=2, max=512)
    example = (seeded(3, 5, 16), seeded(3, 2, 16))
    ep = torch.export.export(model, example, dynamic_shapes={"x": {0: batch, 1: seq}, "y": {0: batch}})
    out = os.path.join(OUT, "dynamic")
    os.makedirs(out, exist_ok=True)
    torch.export.save(ep.run_decompositions(), os.path.join(out, "model.pt2"))
    for b, s in ((3, 5), (8, 9), (64, 2)):
        inputs = (seeded(b, s, 16), seeded(b, 2, 16))
        with torch.no_grad():
            expected = flat_outputs(model(*inputs))
        np.savez(os.path.join(out, f"b{b}_s{s}.inputs.npz"), *[to_numpy(t) for t in inputs])
        np.savez(os.path.join(out, f"b{b}_s{s}.expected.npz"), *[to_numpy(t) for t in expected])
    print("dynamic: symbols", ep.range_constraints)
    # A size that is a multiple of a symbol (an even sequence length), read off the inputs.
    half = torch.export.Dim("half", min=1, max=100)
    example = (seeded(3, 10, 4),)
    ep = torch.export.export(PairFold().eval(), example, dynamic_shapes={"x": {1: 2 * half}})
    torch.export.save(ep.run_decompositions(), os.path.join(out, "derived.pt2"))
    inputs = (seeded(3, 14, 4),)
    np.savez(os.path.join(out, "derived_s14.inputs.npz"), *[to_numpy(t) for t in inputs])
    np.savez(os.path.join(out, "derived_s14.expected.npz"), to_numpy(PairFold()(*inputs)))
    # Compiled per bucket of cache lengths by tpuc run (docs/buckets.md).
    model = DecodingStep().eval()
    length = torch.export.Dim("length", min=2, max=512)
    example = (seeded(2, 5, 16), seeded(2, 1, 16), seeded(2, 1, 16))
    ep = torch.export.export(model, example, dynamic_shapes={"cache": {1: length}, "new": None, "q": None})
    torch.export.save(ep.run_decompositions(), os.path.join(out, "decoding.pt2"))
    for s in (5, 9, 40):
        inputs = (seeded(2, s, 16), seeded(2, 1, 16), seeded(2, 1, 16))
        with torch.no_grad():
            expected = flat_outputs(model(*inputs))
        np.savez(os.path.join(out, f"decoding_s{s}.inputs.npz"), *[to_numpy(t) for t in inputs])
        np.savez(os.path.join(out, f"decoding_s{s}.expected.npz"), *[to_numpy(t) for t in expected])


    # An RNN written with scan over a sequence of dynamic length (and a dynamic batch): compiled
    # per bucket, its loop stops at the true length.
    model = BatchFirstRnn().eval()
    batch = torch.export.Dim("batch", min=2, max=64)
    steps = torch.export.Dim("steps", min=2, max=64)
    example = (seeded(3, 5, 3), seeded(3, 4))
    ep = torch.export.export(model, example, dynamic_shapes={"xs": {0: batch, 1: steps}, "h": {0: batch}})
    torch.export.save(ep, os.path.join(out, "scan.pt2"))
    for b, s in ((3, 5), (2, 9)):
        inputs = (seeded(b, s, 3), seeded(b, 4))
        with torch.no_grad():
            expected = flat_outputs(model(*inputs))
        np.savez(os.path.join(out, f"scan_b{b}_s{s}.inputs.npz"), *[to_numpy(t) for t in inputs])
        np.savez(os.path.join(out, f"scan_b{b}_s{s}.expected.npz"), *[to_numpy(t) for t in expected])


def to_numpy(t):
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.detach().resolve_conj().numpy()


def flat_outputs(out):
    if isinstance(out, torch.Tensor):
        return [out]
    result = []
    for o in out:
        result.extend(flat_outputs(o))
    return result


def main(selected):
    os.makedirs(OUT, exist_ok=True)
    if not selected or "dynamic" in selected:
        dynamic_case()
    for name, (model, inputs) in ERROR_CASES.items():
        if not selected or name in selected:
            ep = torch.export.export(model.eval(), inputs)
            torch.export.save(ep, os.path.join(OUT, "errors", name + ".pt2"))
    for name, model, inputs in cases():
        if selected and name not in selected:
            continue
        model.eval()
        with torch.no_grad():
            expected = flat_outputs(model(*inputs))
            # Dynamo's export keeps blocks captured once (invoke_subgraph); the default inlines them.
            ep = torch.export.export(model, inputs, strict=getattr(model, "strict_export", False))
        for case, program in ((name, ep), (name + "_core", ep.run_decompositions())):
            torch.export.save(program, os.path.join(OUT, case + ".pt2"))
            np.savez(os.path.join(OUT, case + ".inputs.npz"),
                     *[to_numpy(t) for t in inputs])
            np.savez(os.path.join(OUT, case + ".expected.npz"),
                     *[to_numpy(t) for t in expected])
            ops = sorted({str(n.target) for n in program.graph.nodes if n.op == "call_function"})
            print(f"{case}: {len(ops)} ops: {' '.join(ops)}")


if __name__ == "__main__":
    main(set(sys.argv[1:]))
