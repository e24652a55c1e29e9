"""Small, random-weight versions of models TPU users run, for the model-zoo tests."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._higher_order_ops.scan import scan


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x, base=10000.0):
    """Rotary position embedding over the last dimension of (batch, heads, seq, head_dim)."""
    seq, dim = x.shape[-2], x.shape[-1]
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32, device=x.device) / dim))
    angles = torch.outer(torch.arange(seq, dtype=torch.float32, device=x.device), inv)
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Attention(nn.Module):
    """Grouped-query causal attention; `qk_norm` adds Qwen-style RMSNorm of queries and keys."""

    def __init__(self, dim, heads, kv_heads, qk_norm=False):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q = nn.Linear(dim, heads * self.head_dim, bias=qk_norm)
        self.k = nn.Linear(dim, kv_heads * self.head_dim, bias=qk_norm)
        self.v = nn.Linear(dim, kv_heads * self.head_dim, bias=qk_norm)
        self.o = nn.Linear(heads * self.head_dim, dim, bias=False)
        self.q_norm = RMSNorm(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = RMSNorm(self.head_dim) if qk_norm else nn.Identity()

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q_norm(self.q(x).view(b, s, self.heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k(x).view(b, s, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rope(q), rope(k)
        repeat = self.heads // self.kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, s, -1))


class SwiGLU(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class DecoderBlock(nn.Module):
    def __init__(self, dim, heads, kv_heads, hidden, qk_norm=False):
        super().__init__()
        self.attn_norm = RMSNorm(dim)
        self.attn = Attention(dim, heads, kv_heads, qk_norm)
        self.mlp_norm = RMSNorm(dim)
        self.mlp = SwiGLU(dim, hidden)

    def forward(self, x):
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    """Llama-style decoder: RMSNorm, RoPE, GQA, SwiGLU. `qk_norm=True` makes it Qwen-style."""

    def __init__(self, vocab=64, dim=32, layers=2, heads=4, kv_heads=2, hidden=64, qk_norm=False):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(DecoderBlock(dim, heads, kv_heads, hidden, qk_norm) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class GPTBlock(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(approximate="tanh"), nn.Linear(4 * dim, dim))
        self.heads = heads

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        mask = torch.tril(torch.ones(s, s, dtype=torch.bool, device=x.device))
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, s, d))
        return x + self.mlp(self.ln2(x))


class MinGPT(nn.Module):
    """minGPT: learned positions, LayerNorm, explicit masked attention, GELU MLP, tied head."""

    def __init__(self, vocab=64, seq=16, dim=32, layers=2, heads=4):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(1, seq, dim) * 0.02)
        self.blocks = nn.Sequential(*(GPTBlock(dim, heads) for _ in range(layers)))
        self.ln = nn.LayerNorm(dim)

    def forward(self, tokens):
        x = self.tok(tokens) + self.pos[:, : tokens.shape[1]]
        return self.ln(self.blocks(x)) @ self.tok.weight.t()


class DLRM(nn.Module):
    """DLRM: dense MLP, embedding bags for sparse features, pairwise dot interaction, top MLP."""

    def __init__(self, dense=8, tables=(20, 30, 40), dim=8):
        super().__init__()
        self.bottom = nn.Sequential(nn.Linear(dense, 16), nn.ReLU(), nn.Linear(16, dim), nn.ReLU())
        self.embeddings = nn.ModuleList(nn.EmbeddingBag(n, dim, mode="sum") for n in tables)
        pairs = (len(tables) + 1) * len(tables) // 2
        self.top = nn.Sequential(nn.Linear(dim + pairs, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, dense, sparse, offsets):
        x = self.bottom(dense)
        features = [x] + [bag(sparse[i], offsets[i]) for i, bag in enumerate(self.embeddings)]
        t = torch.stack(features, dim=1)
        z = t @ t.transpose(1, 2)
        i, j = torch.triu_indices(t.shape[1], t.shape[1], offset=1)
        return torch.sigmoid(self.top(torch.cat([x, z[:, i, j]], dim=1)))


class UNet(nn.Module):
    """A small UNet: conv blocks with batch norm, max-pool down, transposed-conv up, skips."""

    def __init__(self, channels=3, base=8, classes=2):
        super().__init__()

        def block(cin, cout):
            return nn.Sequential(
                nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
            )

        self.down1, self.down2 = block(channels, base), block(base, base * 2)
        self.middle = block(base * 2, base * 4)
        self.up2 = nn.ConvTranspose2d(base * 4, base * 2, 2, stride=2)
        self.dec2 = block(base * 4, base * 2)
        self.up1 = nn.ConvTranspose2d(base * 2, base, 2, stride=2)
        self.dec1 = block(base * 2, base)
        self.out = nn.Conv2d(base, classes, 1)

    def forward(self, x):
        d1 = self.down1(x)
        d2 = self.down2(F.max_pool2d(d1, 2))
        m = self.middle(F.max_pool2d(d2, 2))
        u2 = self.dec2(torch.cat([self.up2(m), d2], dim=1))
        u1 = self.dec1(torch.cat([self.up1(u2), d1], dim=1))
        return self.out(u1)


def resnet18():
    import torchvision

    return torchvision.models.resnet18(num_classes=10)


class Rnn(nn.Module):
    """An RNN written with scan (forward or reverse) over batch-first inputs (batch, time,
    features): a carried state, the outputs stacked (batch, time)."""

    def __init__(self, reverse=False):
        super().__init__()
        self.reverse = reverse
        self.w_in = nn.Parameter(torch.randn(3, 4) * 0.5)
        self.w_h = nn.Parameter(torch.randn(4, 4) * 0.5)

    def forward(self, xs, h):
        def step(h, x):
            h = torch.tanh(x @ self.w_in + h @ self.w_h)
            return h, h.sum(-1)

        h, out = scan(step, h, xs.movedim(1, 0), reverse=self.reverse)
        return h, out.movedim(0, 1)


def zoo():
    """(name, model, example inputs) of each zoo model, in eval mode with random weights."""
    torch.manual_seed(0)
    tokens = torch.randint(0, 64, (2, 16))
    dense = torch.randn(4, 8)
    sparse = [torch.randint(0, n, (10,)) for n in (20, 30, 40)]
    offsets = [torch.tensor([0, 2, 5, 7]) for _ in range(3)]
    return [
        ("llama", Llama().eval(), (tokens,)),
        ("qwen", Llama(qk_norm=True).eval(), (tokens,)),
        ("resnet18", resnet18().eval(), (torch.randn(2, 3, 32, 32),)),
        ("dlrm", DLRM().eval(), (dense, sparse, offsets)),
        ("mingpt", MinGPT().eval(), (tokens,)),
        ("unet", UNet().eval(), (torch.randn(1, 3, 16, 16),)),
    ]
