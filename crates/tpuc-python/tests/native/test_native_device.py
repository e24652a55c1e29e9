"""The native device (crates/tpuc-python/native): device tensors are plain torch.Tensors of the
PrivateUse1 device whose storage holds a runtime value; every op runs a program compiled once per
key, planned by Python on the first call only."""
import copy
import os
import subprocess
import sys
import warnings

import pytest
import torch

import tpuc
from tpuc import native_device, planner

TOL = {"rtol": 1e-5, "atol": 1e-5}


def _same(got, expected, **tol):
    assert got.device.type == "tpuc", got.device
    torch.testing.assert_close(got.cpu(), expected, **(tol or TOL))


def test_device_tensors_are_plain_tensors_with_their_own_storage():
    x = torch.arange(6.0).reshape(2, 3)
    d = x.to("tpuc")
    assert type(d) is torch.Tensor and d.device == torch.device("tpuc", 0) and d.is_tpuc
    assert d.untyped_storage().nbytes() == 24 and d.untyped_storage().device.type == "tpuc"
    t = d.t()
    assert t.stride() == (1, 3) and not t.is_contiguous()
    assert t.untyped_storage().data_ptr() == d.untyped_storage().data_ptr() and t._base is d
    _same(t, x.t())
    # The storage's bytes read back through the device.
    assert bytes(d.untyped_storage().tolist()) == x.numpy().tobytes()


def test_views_and_in_place_ops_write_the_storage_they_share():
    x = torch.arange(12.0).reshape(3, 4)
    d = x.to("tpuc")
    for t in (x, d):
        t[0].add_(10)
        t.t()[1].mul_(2)               # a strided view of the same storage
        t.view(-1)[::5].zero_()
        t[1:, 2:] += torch.ones(2, 2, device=t.device)
    _same(d, x)
    # A view made before the writes sees them.
    v = d[2]
    d.fill_(3.0)
    _same(v, torch.full((4,), 3.0))


def test_out_arguments_of_another_size_are_resized_and_resize_keeps_the_elements():
    a, b = torch.randn(5), torch.randn(5)
    out = torch.empty(0, device="tpuc")
    torch.add(a.to("tpuc"), b.to("tpuc"), out=out)
    assert out.shape == (5,)
    _same(out, a + b)
    t = torch.arange(4.0).to("tpuc")
    t.resize_(6)
    assert t.shape == (6,)
    _same(t[:4], torch.arange(4.0))


def test_copies_between_the_host_and_the_device():
    x = torch.randn(4, 6)
    _same(x.t().to("tpuc"), x.t())                     # a strided host tensor
    d = torch.zeros(6, 4, device="tpuc")
    d[1:3].copy_(x.t()[1:3])                            # into a view, from the host
    expected = torch.zeros(6, 4)
    expected[1:3] = x.t()[1:3]
    _same(d, expected)
    assert torch.equal(d[:, ::2].cpu(), expected[:, ::2])     # a view back to the host
    _same(torch.tensor([[1, 2], [3, 4]], device="tpuc"), torch.tensor([[1, 2], [3, 4]]))
    _same(x.to("tpuc").to(torch.float64), x.double())
    _same(x.to("tpuc").half().float(), x.half().float())
    # A conjugate is a lazy flag in PyTorch: copying resolves it.
    c = torch.randn(3, dtype=torch.complex64)
    _same(c.to("tpuc").conj(), c.conj())
    _same(torch.fft.ifft(x.to("tpuc")), torch.fft.ifft(x))


def test_ops_whose_size_depends_on_values_run_on_the_device_without_a_word():
    x = torch.tensor([[0.0, 1.5, 0.0], [2.0, 0.0, -3.0]])
    d = x.to("tpuc")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        before = planner.STATS["host_ops"]
        _same(torch.nonzero(d), torch.nonzero(x))
        _same(d[d > 0], x[x > 0])
        _same(torch.masked_select(d, d != 0), torch.masked_select(x, x != 0))
        assert "device='tpuc:0'" in repr(d)             # printing reads values on the device
        assert planner.STATS["host_ops"] == before


def _train(model, batches, steps=3):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for x, y in batches[:steps]:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


class _ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        # No bias before a batch norm: its gradient would be rounding noise, which Adam turns
        # into whole steps.
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.norm = torch.nn.BatchNorm2d(4)
        self.head = torch.nn.Linear(4 * 8 * 8, 2)

    def forward(self, x):
        return self.head(torch.relu(self.norm(self.conv(x))).flatten(1))


def test_training_equals_the_cpu_and_later_steps_never_plan():
    cpu = _ConvNet()
    dev = copy.deepcopy(cpu).to("tpuc")
    batches = [(torch.randn(2, 3, 8, 8), torch.randn(2, 2)) for _ in range(4)]
    expected = _train(cpu, batches)
    got = _train(dev, [(x.to("tpuc"), y.to("tpuc")) for x, y in batches])
    assert got == pytest.approx(expected, rel=1e-4)
    for p, q in zip(dev.parameters(), cpu.parameters()):
        _same(p, q, rtol=1e-4, atol=1e-5)
    # Every op of a step has its program now: another step runs without the planner (the
    # optimizer's step size, a number that changes every step, is an input of its programs).
    hits = native_device.cache_stats()["hits"]
    original = planner.plan

    def refuse(*args):
        raise AssertionError(f"planned again: {args[:2]}")

    planner.plan = refuse
    try:
        _train(dev, [(x.to("tpuc"), y.to("tpuc")) for x, y in batches[3:]], steps=1)
    finally:
        planner.plan = original
    assert native_device.cache_stats()["hits"] > hits


@pytest.mark.parametrize("name", ["llama", "resnet18", "mingpt"])
def test_the_zoo_runs_on_the_device_as_on_the_cpu(name):
    from models import zoo
    model, inputs = next((m, i) for n, m, i in zoo() if n == name)
    with torch.no_grad():
        expected = model(*inputs)
        got = copy.deepcopy(model).to("tpuc")(*[i.to("tpuc") for i in inputs])
    _same(got, expected, rtol=1e-4, atol=1e-4)


def test_an_op_tpuc_cannot_lower_runs_on_the_host_with_a_warning():
    x = torch.randn(4, 4)
    d = x.to("tpuc")
    with pytest.warns(UserWarning, match=r"aten\._linalg_eigvals.*cannot run on the tpuc device.*runs on the CPU"):
        values = torch.linalg.eigvals(d)
    assert values.device.type == "tpuc"
    torch.testing.assert_close(values.cpu(), torch.linalg.eigvals(x))


def test_strict_refuses_what_would_run_on_the_host(tmp_path):
    script = ("import torch, tpuc\nx = torch.randn(4, 4, device='tpuc')\n"
              "try:\n    torch.linalg.eigvals(x)\nexcept Exception as e:\n    print(type(e).__name__, e)\n")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env=dict(os.environ, TPUC_NATIVE="1", TPUC_STRICT="1"))
    assert "cannot run on the tpuc device" in run.stdout and "TPUC_STRICT=1" in run.stdout, run.stdout + run.stderr


def test_bad_uses_are_clear_errors():
    x = torch.randn(3).to("tpuc")
    with pytest.raises(RuntimeError, match="same device"):
        x + torch.randn(3)
    count = torch.tpuc.device_count()
    with pytest.raises(RuntimeError, match=rf"no device {count}: the tpuc device has {count}"):
        torch.ones(2, device=f"tpuc:{count}")
    with pytest.raises(RuntimeError, match="does not handle tensors of dtype"):
        torch.zeros(2).to(torch.float8_e4m3fnuz).to("tpuc")


def test_arguments_sharing_a_storage_are_another_program_than_distinct_ones():
    x, y = torch.randn(4), torch.randn(4)
    dx, dy = x.to("tpuc"), y.to("tpuc")
    dx.add_(dx)           # one storage, read and written
    dx.add_(dy)           # the same layouts, two storages
    x.add_(x)
    x.add_(y)
    _same(dx, x)
    a = torch.arange(8.0)
    d = a.to("tpuc")
    d[:4].add_(d[4:])     # two views of one storage
    a[:4].add_(a[4:])
    _same(d, a)


def test_torch_compile_takes_device_tensors_as_they_are():
    from tpuc.runtime import STATS
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    x = torch.randn(3, 8)
    expected = model(x)
    on_device = copy.deepcopy(model).to("tpuc")
    compiled = torch.compile(on_device, backend="tpuc")
    x_on_device = x.to("tpuc")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled(x_on_device)
        uploads, plans = STATS["uploads"], planner.STATS["plans"]
        got = compiled(x_on_device)
        # The compiled graph ran on the tensors' own values: nothing uploaded, no op planned.
        assert (STATS["uploads"], planner.STATS["plans"]) == (uploads, plans)
        got.sum().backward()
    assert type(got) is torch.Tensor
    _same(got, expected)
    expected.sum().backward()
    _same(on_device[0].weight.grad, model[0].weight.grad)


def test_a_graph_break_runs_its_eager_part_on_the_device():
    def fn(x, y):
        z = x.sin() * 2
        if z.sum() > 0:          # a value read: Dynamo breaks the graph here
            return z + y
        return z - y

    x, y = torch.randn(4, 4), torch.randn(4, 4)
    got = torch.compile(fn, backend="tpuc")(x.to("tpuc"), y.to("tpuc"))
    _same(got, fn(x, y))


def test_a_model_compiled_on_the_device_trains_as_on_the_cpu():
    model = torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
    on_device = copy.deepcopy(model).to("tpuc")
    compiled = torch.compile(on_device, backend="tpuc")
    x = torch.randn(6, 3)
    optimizers = torch.optim.AdamW(model.parameters(), 1e-2), torch.optim.AdamW(on_device.parameters(), 1e-2)
    for _ in range(3):
        for run, optimizer, inputs in ((model, optimizers[0], x), (compiled, optimizers[1], x.to("tpuc"))):
            optimizer.zero_grad()
            run(inputs).square().mean().backward()
            optimizer.step()
    for want, got in zip(model.parameters(), on_device.parameters()):
        _same(got.detach(), want.detach())


def test_views_in_another_dtype_share_the_storage():
    x = torch.randn(2, 4)
    d = x.to("tpuc")
    assert torch.equal(d.view(torch.int32).cpu(), x.view(torch.int32))
    _same(d.view(torch.float16), x.view(torch.float16))
    for t in (x, d):
        c = torch.view_as_complex(t.view(2, 2, 2))
        c.mul_(1j)                                   # written through a complex view
        torch.view_as_real(c)[0, 0, 0] = 5.0         # and through a real view of that
        t.view(torch.int32)[1, 3] = 7                # and through an integer view
    _same(d, x)


def test_numbers_where_torch_takes_them():
    x = torch.rand(3) + 0.5
    d = x.to("tpuc")
    _same(torch.pow(d, 0.5), torch.pow(x, 0.5))
    _same(torch.pow(2.0, d), torch.pow(2.0, x))
    _same(d.new_empty((2,)).fill_(1.5), torch.full((2,), 1.5))
    with pytest.warns(UserWarning, match="hermite_polynomial_h.*runs on the CPU"):   # not lowered yet
        _same(torch.special.hermite_polynomial_h(d, 3), torch.special.hermite_polynomial_h(x, 3))


def test_a_program_on_the_device_runs_and_exits_cleanly_from_anywhere(tmp_path):
    script = ("import torch\nx = torch.ones(2, device='tpuc')\nm = torch.nn.Linear(2, 2).to('tpuc')\n"
              "m(x).sum().backward()\nprint(x + 1)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env=dict(env, TPUC_NATIVE="1", TF_CPP_MIN_LOG_LEVEL="3"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout == "tensor([2., 2.], device='tpuc:0')\n" and run.stderr == "", run.stderr[-3000:]


def test_every_device_of_the_plugin_is_a_device_of_its_own():
    # tools/test.sh runs these tests with TPUC_DEVICES=2.
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


@pytest.mark.parametrize("name", ["llama", "resnet18"])
def test_the_zoo_runs_on_the_second_device_as_on_the_cpu(name):
    from models import zoo
    model, inputs = next((m, i) for n, m, i in zoo() if n == name)
    with torch.no_grad():
        expected = model(*inputs)
        got = copy.deepcopy(model).to("tpuc:1")(*[i.to("tpuc:1") for i in inputs])
    assert got.device.index == 1
    _same(got, expected, rtol=1e-4, atol=1e-4)


def test_a_bad_device_count_is_named(tmp_path):
    run = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path, env=dict(os.environ, TPUC_NATIVE="1", TPUC_DEVICES="zero"))
    assert run.returncode != 0
    assert "TPUC_DEVICES='zero': the number of devices of the tpuc device, 1 or more" in run.stderr, run.stderr[-2000:]


def test_debug_mode_finds_the_first_op_that_goes_wrong(monkeypatch):
    from tpuc import _tpuc_native
    x = torch.randn(7).to("tpuc")
    # A wrong program for one op: sin computed by cos's.
    real = planner._program_plan

    def perturbed(func, flat, spec, signature, call=None, sized=False):
        if func == torch.ops.aten.sin.out:
            call = torch.ops.aten.cos.out
        return real(func, flat, spec, signature, call=call, sized=sized)

    monkeypatch.setattr(planner, "_program_plan", perturbed)
    _tpuc_native.clear_cache()
    try:
        native_device.debug(compare=True)
        y = x * 2  # right: passes
        with pytest.raises(tpuc.TpucError,
                           match=r"aten\.sin\.out differs from the CPU's result by .*test_native_device\.py:\d+: .*y\.sin\(\)"):
            y.sin()
        native_device.debug(finite=True)
        zero = torch.zeros(7).to("tpuc")
        with pytest.raises(tpuc.TpucError, match=r"aten\.div\.out made a NaN or an infinity from finite inputs"):
            x / zero
    finally:
        native_device.debug(False)
        _tpuc_native.clear_cache()
    # Strict mode again: nothing is checked.
    assert torch.isinf((x / torch.zeros(7).to("tpuc")).cpu()).all()


def test_set_puts_a_tensor_over_another_storage():
    a = torch.arange(6.0)
    d = a.to("tpuc")
    over = torch.empty(0, device="tpuc").set_(d.untyped_storage(), 2, (2, 2), (1, 2))
    _same(over, a.as_strided((2, 2), (1, 2), 2))
    _same(torch.empty(0, device="tpuc").set_(d), a)
    assert torch.empty(3, device="tpuc").set_().shape == (0,)
