"""A zoo model trained a few steps on a device beside the same training on the CPU (the tests of
one device and of two share it)."""
import copy

import torch
from models import zoo


def _to(value, device):
    if isinstance(value, (list, tuple)):
        return [v.to(device) for v in value]
    return value.to(device)


# Inputs for training where the zoo's would make it chaotic: batch norm over the two values of
# ResNet's last 1x1 feature maps at 32x32 amplifies rounding, so that float32 and float64 training
# on the CPU already part after one step; at 64x64 they agree to 1e-5.
_TRAINING_INPUTS = {"resnet18": lambda: (torch.randn(2, 3, 64, 64),)}


def assert_trains_as_on_the_cpu(name: str, device: str, steps: int = 2):
    """Trains zoo model `name` for `steps` steps of SGD with momentum on the CPU and, from the
    same weights, on `device`; the losses of every step and the trained state (parameters and
    buffers, batch norm's running statistics included) must agree."""
    cpu, inputs = next((m, i) for n, m, i in zoo() if n == name)
    if name in _TRAINING_INPUTS:
        inputs = _TRAINING_INPUTS[name]()
    cpu.train()
    dev = copy.deepcopy(cpu).to(device)
    on_device = [_to(i, device) for i in inputs]
    optimizers = (torch.optim.SGD(cpu.parameters(), lr=1e-3, momentum=0.9),
                  torch.optim.SGD(dev.parameters(), lr=1e-3, momentum=0.9))
    for step in range(steps):
        losses = []
        for model, optimizer, args in zip((cpu, dev), optimizers, (inputs, on_device)):
            loss = model(*args).square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        assert abs(losses[0] - losses[1]) <= 1e-4 * abs(losses[0]), (name, step, losses)
    trained, wanted = dev.state_dict(), torch.device(device)
    for key, expected in cpu.state_dict().items():
        got = trained[key]
        assert got.device.type == wanted.type and got.device.index == (wanted.index or 0), (key, got.device)
        torch.testing.assert_close(got.cpu(), expected, rtol=1e-4, atol=1e-5, msg=lambda m, key=key: f"{name} {key}: {m}")
