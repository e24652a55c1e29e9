"""The tpuc device with several devices (tools/test.sh runs these tests in a process of their own
with TPUC_DEVICES=2: the CPU plugin's devices are chosen when the device starts)."""
import copy
import os
import subprocess
import sys

import pytest
import torch

TOL = {"rtol": 1e-5, "atol": 1e-5}


def _same(got, expected, **tol):
    assert got.device.type == "tpuc", got.device
    torch.testing.assert_close(got.cpu(), expected, **(tol or TOL))



def test_every_device_of_the_plugin_is_a_device_of_its_own():
    assert torch.tpuc.device_count() == torch.accelerator.device_count() == 2
    x = torch.randn(3, 4)
    on_one = x.to("tpuc:1")
    assert on_one.device == torch.device("tpuc", 1) and (on_one * 2 + 1).device == on_one.device
    _same(on_one * 2 + 1, x * 2 + 1)
    _same(on_one.to("tpuc:0"), x)
    with torch.tpuc.device(1):
        assert torch.zeros(2, device="tpuc").device.index == 1 and torch.tpuc.current_device() == 1
    assert torch.tpuc.current_device() == 0
    torch.tpuc.set_device(1)
    try:
        assert torch.ones(1, device="tpuc").device.index == 1
    finally:
        torch.tpuc.set_device(0)
    with pytest.raises(RuntimeError, match="same device"):
        on_one + x.to("tpuc:0")
    before = torch.tpuc.memory_allocated(1)
    kept = torch.empty(1000, device="tpuc:1").fill_(1.0)
    assert torch.tpuc.memory_allocated(1) >= before + 4000
    del kept


def test_a_model_split_over_two_devices_by_hand_trains_as_on_the_cpu():
    cpu = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    dev = copy.deepcopy(cpu)
    dev[0].to("tpuc:0")
    dev[2].to("tpuc:1")
    optimizers = torch.optim.AdamW(cpu.parameters(), lr=1e-2), torch.optim.AdamW(dev.parameters(), lr=1e-2)
    for _ in range(3):
        x, y = torch.randn(5, 4), torch.randn(5, 2)
        expected = torch.nn.functional.mse_loss(cpu(x), y)
        hidden = dev[1](dev[0](x.to("tpuc:0")))
        got = torch.nn.functional.mse_loss(dev[2](hidden.to("tpuc:1")), y.to("tpuc:1"))
        for loss, optimizer in ((expected, optimizers[0]), (got, optimizers[1])):
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        assert got.item() == pytest.approx(expected.item(), rel=1e-5)
    assert dev[0].weight.device.index == 0 and dev[2].weight.device.index == 1
    for p, q in zip(dev.parameters(), cpu.parameters()):
        _same(p, q)


def test_compiled_graphs_run_on_the_device_of_their_tensors():
    # A graph over tpuc:1's tensors runs there, random ops and host constants included, and a
    # compiled training step leaves parameters and gradients there.
    def f(x):
        return torch.sin(x) * 2 + torch.rand(4, device=x.device) * 0 + torch.tensor(3.0)

    x = torch.arange(4.0)
    got = torch.compile(f, backend="tpuc")(x.to("tpuc:1"))
    assert got.device == torch.device("tpuc", 1)
    _same(got, torch.sin(x) * 2 + 3)
    cpu = torch.nn.Linear(4, 3)
    dev = copy.deepcopy(cpu).to("tpuc:1")
    for model, inputs in ((cpu, x), (torch.compile(dev, backend="tpuc"), x.to("tpuc:1"))):
        model(inputs).pow(2).sum().backward()
    assert dev.weight.grad.device == torch.device("tpuc", 1)
    _same(dev.weight.grad, cpu.weight.grad)
    with pytest.raises(Exception, match="device"):
        torch.compile(lambda a, b: a + b, backend="tpuc")(x.to("tpuc:0"), x.to("tpuc:1"))


@pytest.mark.parametrize("name", ["llama", "qwen", "resnet18", "dlrm", "mingpt", "unet"])
def test_the_zoo_trains_on_the_second_device_as_on_the_cpu(name):
    from zoo_training import assert_trains_as_on_the_cpu
    assert_trains_as_on_the_cpu(name, "tpuc:1")


def test_a_bad_device_count_is_named(tmp_path):
    run = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path, env=dict(os.environ, TPUC_DEVICES="zero"))
    assert run.returncode != 0
    assert "TPUC_DEVICES='zero': the number of devices of the tpuc device, 1 or more" in run.stderr, run.stderr[-2000:]
