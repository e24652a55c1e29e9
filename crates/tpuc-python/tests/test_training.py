"""Training through torch.compile(backend="tpuc"): forward and backward graphs compiled, the
optimizer stepping parameters in place between calls (so cached device buffers must follow)."""
import copy

import pytest
import torch
import torch.nn.functional as F

from models import Llama, MinGPT

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
