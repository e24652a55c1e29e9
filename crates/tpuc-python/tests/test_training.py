"""Training through torch.compile(backend="tpuc"): forward and backward graphs compiled, the
optimizer stepping parameters in place between calls (so cached device buffers must follow)."""
import copy

import pytest
import torch
import torch.nn.functional as F
from models import Llama, MinGPT

from tpuc.runtime import STATS

STEPS = 20


def batches(vocab=64, seq=16):
    generator = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        tokens = torch.randint(0, vocab, (2, seq + 1), generator=generator)
        yield tokens[:, :-1], tokens[:, 1:]


def loss_fn(model, tokens, targets):
    logits = model(tokens)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


OPTIMIZERS = {
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1),
    "sgd": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
}


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
@pytest.mark.parametrize("model_cls", [Llama, MinGPT], ids=["llama", "mingpt"])
def test_training_matches_eager(model_cls, optimizer):
    torch.manual_seed(0)
    eager = model_cls()
    ours = copy.deepcopy(eager)
    compiled = torch.compile(ours, backend="tpuc", options={"strict": True})
    opt_eager = OPTIMIZERS[optimizer](eager.parameters())
    opt_ours = OPTIMIZERS[optimizer](ours.parameters())
    losses = []
    for step, (tokens, targets) in enumerate(batches()):
        loss_e = loss_fn(eager, tokens, targets)
        loss_o = loss_fn(compiled, tokens, targets)
        loss_e.backward()
        loss_o.backward()
        # Differences grow slowly as the two runs' parameters drift by rounding.
        tol = 1e-5 * (1 + step)
        torch.testing.assert_close(loss_o, loss_e, rtol=tol, atol=tol, msg=f"loss at step {step}")
        for (name, p_e), p_o in zip(eager.named_parameters(), ours.parameters()):
            torch.testing.assert_close(
                p_o.grad, p_e.grad, rtol=1e-4 * (1 + step), atol=1e-5 * (1 + step),
                msg=f"gradient of {name} at step {step}",
            )
        opt_eager.step()
        opt_ours.step()
        opt_eager.zero_grad()
        opt_ours.zero_grad()
        losses.append(loss_o.item())
    assert losses[-1] < losses[0], "the model learns"
    for (name, p_e), p_o in zip(eager.named_parameters(), ours.parameters()):
        # Adam scales every gradient to a step of about lr, so an element whose gradient is pure
        # rounding noise (the key bias, which softmax ignores) takes noise-sized steps of full
        # size in both runs. Compare the elements whose gradients carry signal.
        signal = torch.ones_like(p_e, dtype=torch.bool)
        if optimizer == "adamw":
            signal = opt_eager.state[p_e]["exp_avg"].abs() > 1e-6
        torch.testing.assert_close(
            p_o[signal], p_e[signal], rtol=1e-3, atol=1e-4, msg=f"parameter {name} after training"
        )


def gradients_match(model, make_loss, steps=3, lr=0.05):
    """Training steps (SGD) of `model` eager and compiled strictly with tpuc: the same loss and
    gradients at every step."""
    torch.manual_seed(0)
    eager = model
    ours = copy.deepcopy(eager)
    compiled = torch.compile(ours, backend="tpuc", options={"strict": True})
    opt_eager = torch.optim.SGD(eager.parameters(), lr=lr)
    opt_ours = torch.optim.SGD(ours.parameters(), lr=lr)
    for step in range(steps):
        loss_e, loss_o = make_loss(eager, step), make_loss(compiled, step)
        loss_e.backward()
        loss_o.backward()
        torch.testing.assert_close(loss_o, loss_e, rtol=1e-4, atol=1e-5, msg=f"loss at step {step}")
        for (name, p_e), p_o in zip(eager.named_parameters(), ours.parameters()):
            if p_e.grad is None:
                assert p_o.grad is None, name
                continue
            torch.testing.assert_close(p_o.grad, p_e.grad, rtol=1e-3, atol=1e-5,
                                       msg=f"gradient of {name} at step {step}")
        for opt in (opt_eager, opt_ours):
            opt.step()
            opt.zero_grad()


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_embedding_bags_train_as_in_eager(mode):
    from models import DLRM

    model = DLRM()
    for bag in model.embeddings:
        bag.mode = mode

    def loss(m, step):
        g = torch.Generator().manual_seed(step)
        dense = torch.randn(4, 8, generator=g)
        sparse = [torch.randint(0, n, (10,), generator=g) for n in (20, 30, 40)]
        offsets = [torch.tensor([0, 2, 5, 7]) for _ in range(3)]
        return m(dense, sparse, offsets).sum()

    gradients_match(model, loss)


class EveryLayer(torch.nn.Module):
    """Every activation, pooling and normalisation layer torch.nn offers (deterministic ones),
    each on a tensor of the rank it takes, their outputs summed."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.activations = nn.ModuleList([
            nn.ReLU(), nn.ReLU6(), nn.LeakyReLU(0.1), nn.PReLU(), nn.ELU(), nn.SELU(), nn.CELU(0.5), nn.GELU(),
            nn.GELU(approximate="tanh"), nn.SiLU(), nn.Mish(), nn.Softplus(beta=2.0), nn.Softsign(),
            nn.Softshrink(0.3), nn.Hardshrink(0.3), nn.Tanhshrink(), nn.Hardtanh(-0.5, 0.5), nn.Hardsigmoid(),
            nn.Hardswish(), nn.Sigmoid(), nn.LogSigmoid(), nn.Tanh(), nn.Threshold(0.1, -1.0), nn.GLU(),
            nn.Softmax(dim=1), nn.LogSoftmax(dim=1), nn.Softmin(dim=1),
        ])
        self.pools_1d = nn.ModuleList([nn.MaxPool1d(2), nn.AvgPool1d(3, stride=2, padding=1),
                                       nn.AdaptiveAvgPool1d(3), nn.AdaptiveMaxPool1d(3), nn.LPPool1d(2, 2)])
        self.pools_2d = nn.ModuleList([nn.MaxPool2d(2), nn.AvgPool2d(2, ceil_mode=True), nn.AdaptiveAvgPool2d((3, 2)),
                                       nn.AdaptiveMaxPool2d((3, 2)), nn.LPPool2d(2, 2)])
        self.pools_3d = nn.ModuleList([nn.MaxPool3d(2), nn.AvgPool3d(2), nn.AdaptiveAvgPool3d(2), nn.AdaptiveMaxPool3d(2)])
        self.norms_1d = nn.ModuleList([nn.BatchNorm1d(4), nn.InstanceNorm1d(4, affine=True), nn.GroupNorm(2, 4),
                                       nn.LayerNorm(8), nn.RMSNorm(8), nn.LocalResponseNorm(2)])
        self.norms_2d = nn.ModuleList([nn.BatchNorm2d(4), nn.InstanceNorm2d(4, affine=True)])
        self.norms_3d = nn.ModuleList([nn.BatchNorm3d(4), nn.InstanceNorm3d(4, affine=True)])
        self.mix = nn.Linear(8, 8)

    def forward(self, x):
        b = x.shape[0]
        h = self.mix(x)  # [b, 4, 8]: every layer's input depends on a trained weight
        total = sum(a(h).sum() for a in self.activations)
        total = total + sum(p(h).pow(2).sum() for p in self.pools_1d)
        h2 = h.reshape(b, 4, 4, 2).repeat(1, 1, 2, 3)
        total = total + sum(p(h2).sum() for p in self.pools_2d)
        h3 = h.reshape(b, 4, 2, 2, 2).repeat(1, 1, 2, 2, 2)
        total = total + sum(p(h3).sum() for p in self.pools_3d)
        total = total + sum((n(h) * h).sum() for n in self.norms_1d)
        total = total + sum((n(h2) * h2).sum() for n in self.norms_2d)
        total = total + sum((n(h3) * h3).sum() for n in self.norms_3d)
        return total


def test_every_activation_pooling_and_normalisation_layer_trains_as_in_eager():
    def loss(m, step):
        g = torch.Generator().manual_seed(step)
        return m(torch.randn(3, 4, 8, generator=g)) / 100

    gradients_match(EveryLayer(), loss)


def test_the_backward_compiles_ahead_beside_the_forward():
    """A training graph's backward starts compiling once the forward is compiled, and the
    backward's own compilation finds it: gradients as in eager."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    reference = copy.deepcopy(model)
    x = torch.randn(5, 8)
    ahead = STATS["compiled_ahead"]
    torch.compile(model, backend="tpuc", options={"cache_dir": "off"})(x).square().sum().backward()
    reference(x).square().sum().backward()
    assert STATS["compiled_ahead"] - ahead == 1
    for mine, theirs in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-5, atol=1e-5)
