"""tpuc's random-number contract (docs/random.md): random ops draw from StableHLO's THREE_FRY
generator, seeded per call from torch's default generator. Numbers follow torch's distributions
and repeat under torch.manual_seed; they are not torch's own numbers."""
import os
import subprocess

import numpy as np
import torch
import torch.nn.functional as F
from test_zoo import tpuc_binary

N = 200_000


def compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, backend="tpuc", options={"strict": True})


def test_uniform_and_normal_follow_their_distributions():
    f = compiled(lambda x: (torch.rand(N) + x, torch.randn(N) + x, torch.rand(1000, dtype=torch.bfloat16) + x))
    u, z, half = f(torch.zeros(()))
    assert u.dtype == torch.float32 and u.shape == (N,)
    assert 0.0 <= u.min() and u.max() < 1.0
    # Standard errors at N = 2e5: mean 6.5e-4, variance ~2e-4; 6 sigma bounds.
    assert abs(u.mean().item() - 0.5) < 4e-3
    assert abs(u.var().item() - 1 / 12) < 2e-3
    assert abs(z.mean().item()) < 1.4e-2
    assert abs(z.std().item() - 1.0) < 1e-2
    # Fraction beyond 2 sigma: 4.55%.
    assert abs((z.abs() > 2).float().mean().item() - 0.0455) < 3e-3
    assert half.max() < 1.0 and half.min() >= 0.0


def test_manual_seed_repeats_and_calls_differ():
    f = compiled(lambda x: x + torch.rand(64))
    x = torch.zeros(64)
    torch.manual_seed(7)
    first, second = f(x), f(x)
    torch.manual_seed(7)
    again = f(x)
    torch.testing.assert_close(again, first, rtol=0, atol=0)
    assert not torch.equal(first, second)


def test_dropout_in_training():
    p = 0.3
    f = compiled(lambda x: F.dropout(x, p, training=True))
    x = torch.ones(N)
    y = f(x)
    kept = y != 0
    assert abs(kept.float().mean().item() - (1 - p)) < 6e-3
    torch.testing.assert_close(y[kept], torch.full_like(y[kept], 1 / (1 - p)))
    # Evaluation mode is the identity.
    g = compiled(lambda x: F.dropout(x, p, training=False))
    torch.testing.assert_close(g(x), x)


def test_dropout_backward_uses_the_same_mask():
    lin = torch.nn.Linear(16, 16)
    model = compiled(lambda x: F.dropout(lin(x), 0.5, training=True).sum())
    x = torch.randn(8, 16, requires_grad=True)
    loss = model(x)
    loss.backward()
    # d(sum(dropout(xW^T + b)))/db = (number kept per column) * 2; each entry is a multiple of 2.
    grad = lin.bias.grad
    assert torch.all(grad == torch.round(grad / 2) * 2)
    assert 0 < grad.sum() < 8 * 16 * 2


def test_randperm_randint_bernoulli():
    f = compiled(lambda x: (torch.randperm(1000) + x, torch.randint(3, 9, (N,)) + x,
                            torch.bernoulli(torch.full((N,), 0.25)) + x))
    perm, ints, bits = f(torch.zeros((), dtype=torch.int64))
    assert sorted(perm.tolist()) == list(range(1000))
    assert ints.min() == 3 and ints.max() == 8
    counts = torch.bincount(ints - 3).float() / N
    assert torch.all((counts - 1 / 6).abs() < 6e-3), counts
    assert abs(bits.float().mean().item() - 0.25) < 6e-3


class Noisy(torch.nn.Module):
    def forward(self, x):
        return x + torch.rand_like(x)


def test_tpuc_run_seed(tmp_path):
    """`tpuc run --seed`: the same seed gives the same numbers, another seed others."""
    x = torch.zeros(4, 8)
    archive = tmp_path / "noisy.pt2"
    torch.export.save(torch.export.export(Noisy(), (x,)), str(archive))
    np.save(tmp_path / "x.npy", x.numpy())

    def run(seed, out):
        result = subprocess.run(
            [tpuc_binary(), "run", str(archive), "--input", str(tmp_path / "x.npy"), "--out",
             str(tmp_path / out), "--seed", str(seed)],
            capture_output=True, text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        )
        assert result.returncode == 0, result.stdout + result.stderr
        return np.load(tmp_path / out / "out0.npy")

    a, b, c = run(1, "a"), run(1, "b"), run(2, "c")
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert a.min() >= 0 and a.max() < 1

