"""The tpuc device (crates/tpuc-python/native, tpuc/device.py): device tensors are plain
torch.Tensors of the PrivateUse1 device whose storage holds a runtime value; every op runs a
program compiled once per key, planned by Python on the first call only (strict mode), or is
recorded and run in fused runs (fused mode), or is checked as it runs (debug mode). Tests of
several devices: tests/devices."""
import copy
import json
import os
import subprocess
import sys
import warnings

import pytest
import torch

import tpuc
import tpuc.device as device
from tpuc import _tpuc_native, plan_store, planner
from tpuc.runtime import STATS

TOL = {"rtol": 1e-5, "atol": 1e-5}


def _same(got, expected, **tol):
    assert got.device.type == "tpuc", got.device
    torch.testing.assert_close(got.cpu(), expected, **(tol or TOL))


def _set_mode(name):
    if name == "fused":
        device.fused()
    elif name == "debug":
        device.debug()
    else:
        device.fused(False)
        device.debug(False)


@pytest.fixture(params=["strict", "fused"])
def mode(request):
    """Runs the test in strict and in fused mode."""
    _set_mode(request.param)
    yield request.param
    _set_mode("strict")



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


def test_live_storages_have_addresses_no_other_overlaps_and_freed_ones_are_given_again():
    # torch tells overlapping tensors by address, so each storage has a range of its own; the
    # ranges come from one reserved region, without a system call per storage.
    sizes = [1, 3, 64, 65, 1000, 4096, 70000, 1 << 20]
    storages = [torch.empty(n, dtype=torch.uint8, device="tpuc") for n in sizes for _ in range(3)]
    ranges = sorted((t.data_ptr(), t.data_ptr() + t.numel()) for t in storages)
    assert all(end <= start for (_, end), (start, _) in zip(ranges, ranges[1:]))
    freed = storages[-1].data_ptr()
    del storages[-1]
    assert torch.empty(1 << 20, dtype=torch.uint8, device="tpuc").data_ptr() == freed


def test_tensors_move_to_the_device_and_back():
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    t = x.to("tpuc")
    assert t.device == torch.device("tpuc", 0) and t.is_tpuc and not x.is_tpuc
    assert t.shape == x.shape and t.dtype == x.dtype
    back = t.cpu()
    assert back.device.type == "cpu" and torch.equal(back, x)
    assert t.cpu().numpy().tolist() == x.tolist()
    # The device's copy is its own: changing the source later changes nothing on the device.
    x.add_(1)
    assert torch.equal(t.cpu(), x - 1)
    assert repr(t) == "tensor([[0., 1., 2.],\n        [3., 4., 5.]], device='tpuc:0')"
    assert repr(torch.zeros(2, dtype=torch.float16, device="tpuc")) == \
        "tensor([0., 0.], device='tpuc:0', dtype=torch.float16)"
    assert t.sum().item() == 15.0
    assert bool((t >= 0).all()) and not bool((t > 4).all())
    assert torch.tpuc.is_available() and torch.tpuc.device_count() == 1
    assert t.to(torch.int32).cpu().dtype == torch.int32


def _batch_norm(x, stats):
    mean, var = stats[0].clone(), stats[1].clone()
    out = torch.ops.aten._native_batch_norm_legit(x, None, None, mean, var, True, 0.1, 1e-5)
    return (*out, mean, var)


def test_ops_run_on_the_device_and_match_the_cpu(mode):
    torch.manual_seed(0)
    a, b = torch.randn(4, 5), torch.randn(5, 3)
    stats = torch.stack([torch.zeros(5), torch.ones(5)])
    da, db = a.to("tpuc"), b.to("tpuc")
    cases = [
        (lambda x, y: (x @ y).relu(), (a, b), (da, db)),
        (lambda x, y: (x * 2.5 + 1).sin().sum(dim=1), (a, b), (da, db)),
        (lambda x, y: torch.softmax(x, dim=-1).max(dim=0).values, (a, b), (da, db)),
        (lambda x, y: x.to(torch.int64) + 1.5, (a, b), (da, db)),  # promotion as on the CPU
        (lambda x, y: x[1:3, ::2] - x.mean(), (a, b), (da, db)),
        # A conjugate is a flag on a tensor in PyTorch (ifft of real input conjugates a view).
        (lambda x, y: torch.fft.ifft(x), (a, b), (da, db)),
        # Batch norm in training: its output and statistics, its running ones updated in place.
        (_batch_norm, (a, stats), (da, stats.to("tpuc"))),
    ]
    for fn, cpu_args, dev_args in cases:
        expected, got = fn(*cpu_args), fn(*dev_args)
        for e, g in zip(torch.utils._pytree.tree_leaves(expected), torch.utils._pytree.tree_leaves(got)):
            assert g.device.type == "tpuc"
            assert g.dtype == e.dtype
            torch.testing.assert_close(g.cpu(), e, **TOL)


def test_an_op_compiles_once_for_its_argument_types():
    x = torch.randn(3, 7).to("tpuc")
    (x * x).cos()
    before = STATS["compiles"]
    for _ in range(3):
        (x * x).cos()
    assert STATS["compiles"] == before
    # Another shape is another program.
    y = torch.randn(2, 7).to("tpuc")
    (y * y).cos()
    assert STATS["compiles"] == before + 2


def test_views_share_their_storage(mode):
    base = torch.zeros(4, 4, device="tpuc")
    column = base[:, 1]
    transposed = base.t()
    column.add_(3)
    # The update through one view is seen in the base and in every other view of it.
    expected = torch.zeros(4, 4)
    expected[:, 1] = 3
    assert torch.equal(base.cpu(), expected)
    assert torch.equal(transposed.cpu(), expected.t())
    transposed[0].fill_(7)  # the base's first column
    expected[:, 0] = 7
    assert torch.equal(base.cpu(), expected)
    base[1:3, 2:4] = 1
    expected[1:3, 2:4] = 1
    assert torch.equal(base.cpu(), expected)
    index = torch.tensor([0, 3]).to("tpuc")
    base[index] = torch.full((4,), 9.0).to("tpuc")
    expected[torch.tensor([0, 3])] = 9.0
    assert torch.equal(base.cpu(), expected)
    assert torch.equal(column.cpu(), expected[:, 1])
    # Ops changing a tensor's own sizes and strides (squeeze_, t_, unsqueeze_).
    changed, reference = base[:2].clone(), expected[:2].clone()
    for op in ("t_", "unsqueeze_", "squeeze_"):
        args = (0,) if op != "t_" else ()
        getattr(changed, op)(*args)
        getattr(reference, op)(*args)
        assert changed.shape == reference.shape and torch.equal(changed.cpu(), reference)
    # out= writes into the given tensor.
    out = torch.empty(4, 4, device="tpuc")
    torch.add(base, 1, out=out)
    assert torch.equal(out.cpu(), expected + 1)
    # copy_ across devices, both ways.
    target = torch.zeros(2, 2, device="tpuc")
    target.copy_(torch.ones(2, 2))
    assert torch.equal(target.cpu(), torch.ones(2, 2))
    host = torch.zeros(2, 2)
    host.copy_(target * 3)
    assert torch.equal(host, torch.full((2, 2), 3.0))


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
        for kwargs in ({}, {"return_inverse": True, "return_counts": True}, {"return_counts": True}):
            for got, want in zip(torch.unique(d, **kwargs) if kwargs else [torch.unique(d)],
                                 torch.unique(x, **kwargs) if kwargs else [torch.unique(x)]):
                _same(got, want)
        i = torch.tensor([3, 1, 3, 3, 0, 1])
        _same(torch.unique(i.to("tpuc"), return_counts=True)[1], torch.unique(i, return_counts=True)[1])
        runs = torch.tensor([[2, 2, 5], [5, 5, 1]])
        for kwargs in ({}, {"return_inverse": True, "return_counts": True}, {"return_counts": True}):
            got, want = (torch.unique_consecutive(t, **kwargs) for t in (runs.to("tpuc"), runs))
            for g, w in zip(*((r,) if isinstance(r, torch.Tensor) else r for r in (got, want)), strict=True):
                _same(g, w)
        # Along a dimension: slices compared whole, sorted lexicographically (unique_dim).
        rows = torch.tensor([[1, 2, 0], [1, 2, 0], [3, 4, 1], [0, 9, 1], [1, 2, 0]])
        for dim in (0, 1):
            for op, flags in ((torch.ops.aten.unique_dim.default, (dim, True, True, True)),
                              (torch.ops.aten.unique_consecutive.default, (True, True, dim))):
                for g, w in zip(op(rows.to("tpuc"), *flags), op(rows, *flags), strict=True):
                    _same(g, w)
                    assert g.is_contiguous()
        # bincount's size is the largest value's: read back, then counted on the device.
        ints = torch.tensor([4, 1, 1, 0, 7])
        _same(torch.bincount(ints.to("tpuc")), torch.bincount(ints))
        _same(torch.bincount(ints.to("tpuc"), minlength=10), torch.bincount(ints, minlength=10))
        weights = torch.tensor([0.5, 1.0, 2.0, -1.0, 3.0])
        _same(torch.bincount(ints.to("tpuc"), weights.to("tpuc")), torch.bincount(ints, weights))
        _same(torch.bincount(ints.to("tpuc"), ints.to("tpuc")), torch.bincount(ints, ints))  # float64
        _same(torch.bincount(ints[:0].to("tpuc"), minlength=2), torch.bincount(ints[:0], minlength=2))
        # equal: one boolean read back (NaN equals nothing; other sizes are unequal).
        nan = torch.tensor([1.0, float("nan")])
        for a, b in ((x, x.clone()), (x, x + 1), (x, x[:1]), (nan, nan), (ints, ints), (ints[:0], ints[:0])):
            assert torch.equal(a.to("tpuc"), b.to("tpuc")) is torch.equal(a, b)
        assert "device='tpuc:0'" in repr(d)             # printing reads values on the device
        assert planner.STATS["host_ops"] == before
    for bad in (torch.tensor([2, -1]), torch.tensor([[1]])):
        with pytest.raises(RuntimeError, match="1-d non-negative integral"):
            torch.bincount(bad.to("tpuc"))
    with pytest.raises(RuntimeError, match="same length"):
        torch.bincount(ints.to("tpuc"), weights[:2].to("tpuc"))
    with pytest.raises(RuntimeError, match="scalar type"):
        torch.equal(ints.to("tpuc"), ints.float().to("tpuc"))
    with pytest.raises(RuntimeError, match="different devices"):
        torch.equal(ints.to("tpuc"), ints)


def test_factories_make_device_tensors(mode):
    assert torch.equal(torch.tensor([1.5, 2.0], device="tpuc").cpu(), torch.tensor([1.5, 2.0]))
    assert torch.tensor(3, device="tpuc").item() == 3
    assert torch.equal(torch.ones(2, 3, device="tpuc").cpu(), torch.ones(2, 3))
    assert torch.equal(torch.zeros(3, dtype=torch.int64, device="tpuc").cpu(), torch.zeros(3, dtype=torch.int64))
    assert torch.equal(torch.arange(5, device="tpuc").cpu(), torch.arange(5))
    assert torch.equal(torch.full((2,), 4.5, device="tpuc").cpu(), torch.full((2,), 4.5))
    # Random factories draw on the device, their seeds from torch's generator: torch.manual_seed
    # repeats them (in fused mode too, where each draws its seed when it is called).
    torch.manual_seed(3)
    first = torch.randn(64, 64, device="tpuc")
    torch.manual_seed(3)
    again = torch.randn(64, 64, device="tpuc")
    assert torch.equal(first.cpu(), again.cpu())
    assert abs(first.mean().item()) < 0.05 and abs(first.std().item() - 1) < 0.05


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
    hits = device.cache_stats()["hits"]
    original = planner.plan

    def refuse(*args):
        raise AssertionError(f"planned again: {args[:2]}")

    planner.plan = refuse
    try:
        _train(dev, [(x.to("tpuc"), y.to("tpuc")) for x, y in batches[3:]], steps=1)
    finally:
        planner.plan = original
    assert device.cache_stats()["hits"] > hits


def test_16_bit_layer_and_group_norm_round_once_as_on_the_cpu():
    # Torch's composite kernel for other devices normalizes with batch norm and then applies the
    # weight and bias in another op, rounding to 16 bits in between; the CPU rounds once.
    torch.manual_seed(0)
    x = torch.randn(4, 6, 8) * 3
    weight, bias = torch.randn(8) * 2, torch.randn(8)
    for dtype in (torch.float16, torch.bfloat16):
        args = [t.to(dtype) for t in (x, weight, bias)]
        expected = torch.nn.functional.layer_norm(args[0], (8,), args[1], args[2], eps=0.5)
        twice = torch.addcmul(args[2], torch.nn.functional.layer_norm(args[0], (8,), eps=0.5), args[1])
        assert not torch.equal(twice, expected)  # the data tells the two apart
        got = torch.nn.functional.layer_norm(*[a.to("tpuc") for a in args[:1]], (8,),
                                             *[a.to("tpuc") for a in args[1:]], eps=0.5)
        _same(got, expected, rtol=torch.finfo(dtype).eps, atol=0)  # an ulp: XLA may vectorise otherwise
        group = [args[0], torch.randn(6).to(dtype), torch.randn(6).to(dtype)]
        _same(torch.nn.functional.group_norm(group[0].to("tpuc"), 3, *[a.to("tpuc") for a in group[1:]]),
              torch.nn.functional.group_norm(group[0], 3, *group[1:]), rtol=2 ** -7, atol=2 ** -8)


def test_batch_norm_updates_its_running_statistics(mode):
    # native_batch_norm writes them without saying so in its schema; calls in a row must each
    # see the previous one's update (fused mode records them in one run), eval mode none.
    cpu = torch.nn.BatchNorm1d(3).train()
    dev = copy.deepcopy(cpu).to("tpuc")
    x = torch.randn(4, 3)
    on_device = x.to("tpuc")
    for _ in range(3):
        expected, got = cpu(x), dev(on_device)
    cpu.eval(), dev.eval()
    expected, got = cpu(x), dev(on_device)
    for name, value in cpu.state_dict().items():
        torch.testing.assert_close(dev.state_dict()[name].cpu(), value, msg=lambda m, name=name: f"{name}: {m}")
    _same(got, expected)


@pytest.mark.parametrize("optimizer", [torch.optim.SGD, torch.optim.AdamW], ids=["sgd", "adamw"])
def test_training_on_the_device_matches_the_cpu(optimizer, mode):
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    dev = copy.deepcopy(cpu).to("tpuc")
    assert all(p.device.type == "tpuc" for p in dev.parameters())
    x, y = torch.randn(5, 8), torch.randn(5, 4)
    xd, yd = x.to("tpuc"), y.to("tpuc")
    opt_cpu, opt_dev = optimizer(cpu.parameters(), lr=1e-2), optimizer(dev.parameters(), lr=1e-2)
    # Fused mode's first step differs from the others (the optimizer makes its state).
    settled = 0 if mode == "strict" else 1
    for _ in range(4):
        loss_cpu = torch.nn.functional.mse_loss(cpu(x), y)
        loss_cpu.backward()
        opt_cpu.step()
        opt_cpu.zero_grad()
        loss_dev = torch.nn.functional.mse_loss(dev(xd), yd)
        loss_dev.backward()
        opt_dev.step()
        opt_dev.zero_grad()
        assert abs(loss_dev.item() - loss_cpu.item()) < 1e-5
        if _ == settled:
            after_first = STATS["compiles"]
    # Later steps compile nothing: their changing numbers (Adam's bias corrections) are inputs;
    # in fused mode, each step is one run of the same structure.
    assert STATS["compiles"] == after_first
    for p, q in zip(cpu.parameters(), dev.parameters()):
        torch.testing.assert_close(q.cpu(), p, **TOL)


OPTIMIZER_STEPS = {
    "adamw_fused": (torch.optim.AdamW, {"fused": True, "weight_decay": 0.1}),
    "adamw_fused_amsgrad_maximize": (torch.optim.AdamW, {"fused": True, "amsgrad": True, "maximize": True}),
    "adam_fused_tensor_lr": (torch.optim.Adam, {"fused": True, "weight_decay": 0.1, "lr": torch.tensor(0.05)}),
    "adamw_foreach": (torch.optim.AdamW, {"foreach": True}),
    "sgd_fused": (torch.optim.SGD, {"fused": True, "momentum": 0.9}),
    "sgd_foreach": (torch.optim.SGD, {"foreach": True, "momentum": 0.9, "nesterov": True}),
    "adagrad_fused": (torch.optim.Adagrad, {"fused": True}),
}


@pytest.mark.parametrize("case", OPTIMIZER_STEPS)
def test_every_optimizer_implementation_updates_every_parameter_as_the_cpu(case):
    """The fused and foreach implementations write lists of tensors in one op (fused Adam(W) is
    traced as its writes; fused SGD and Adagrad run on the host): every list's tensors are written."""
    optimizer, options = OPTIMIZER_STEPS[case]
    torch.manual_seed(0)
    params, grads = [torch.randn(5, 3), torch.randn(7)], [torch.randn(5, 3), torch.randn(7)]

    def trained(device):
        on_device = [p.clone().to(device).requires_grad_() for p in params]
        opt = optimizer(on_device, **{"lr": 0.1, **options, **({"lr": options["lr"].clone()} if "lr" in options else {})})
        for _ in range(3):
            for p, g in zip(on_device, grads):
                p.grad = g.clone().to(device)  # SGD with nesterov writes into the gradients
            opt.step()
        return [p.detach().cpu() for p in on_device], opt.state_dict()["state"]

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "tpuc: aten._fused_(sgd|adagrad)_")
        (got, got_state), (want, want_state) = trained("tpuc"), trained("cpu")
    for p, q, initial in zip(got, want, params):
        assert not torch.equal(q, initial)
        torch.testing.assert_close(p, q, **TOL)
    for index, state in want_state.items():
        for name, value in state.items():
            if isinstance(value, torch.Tensor):
                torch.testing.assert_close(got_state[index][name].cpu(), value, **TOL)


def test_fused_adamw_unscales_gradients_and_skips_a_step_with_infinities():
    torch.manual_seed(0)
    params, grads, exp_avgs, exp_avg_sqs = (torch.randn(4, 3) for _ in range(4))
    tensors = [[params], [grads], [exp_avgs], [exp_avg_sqs.abs()]]
    step = [torch.tensor(2.0)]
    for found in (0.0, 1.0):
        def run(device, found=found):
            lists = [[t[0].clone().to(device)] for t in tensors]
            torch.ops.aten._fused_adamw_(*lists, [], [s.to(device) for s in step], lr=0.1, beta1=0.9, beta2=0.99,
                                         weight_decay=0.01, eps=1e-8, amsgrad=False, maximize=False,
                                         grad_scale=torch.tensor(4.0, device=device),
                                         found_inf=torch.tensor(found, device=device))
            return [t[0].cpu() for t in lists]
        for got, want, before in zip(run("tpuc"), run("cpu"), tensors):
            torch.testing.assert_close(got, want, **TOL)
            assert torch.equal(got, before[0]) == (found == 1.0)


@pytest.mark.parametrize("optimizer", [torch.optim.Adam, torch.optim.AdamW])
def test_a_learning_rate_schedule_plans_fused_adam_once(optimizer):
    """Every hyperparameter of the fused step is an input of its program: a schedule's new
    learning rate each step (TorchTitan's warmup) plans and compiles nothing more."""
    torch.manual_seed(0)
    cpu = torch.nn.Linear(6, 5)
    dev = torch.nn.Linear(6, 5).to("tpuc")
    dev.load_state_dict(cpu.state_dict())
    optimizers = [optimizer(m.parameters(), lr=1e-3, weight_decay=0.1, fused=True) for m in (cpu, dev)]
    schedules = [torch.optim.lr_scheduler.LambdaLR(o, lambda step: step + 1.0) for o in optimizers]
    x = torch.randn(4, 6)
    plans = []
    for _ in range(4):
        for model, opt, schedule, data in zip((cpu, dev), optimizers, schedules, (x, x.to("tpuc"))):
            opt.zero_grad()
            model(data).square().sum().backward()
            opt.step()
            schedule.step()
        plans.append(torch.tpuc.cache_stats()["plans"])
    assert plans[1] == plans[2] == plans[3], plans
    for p, q in zip(cpu.parameters(), dev.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), **TOL)


def test_python_numbers_are_inputs_of_an_ops_program():
    x = torch.randn(3, 5)
    d = x.to("tpuc")
    torch.testing.assert_close((d * 0.5).cpu(), x * 0.5, **TOL)
    before = STATS["compiles"]
    for value in (0.25, -3.0, 1e-8):
        torch.testing.assert_close((d * value).cpu(), x * value, **TOL)
        torch.testing.assert_close(d.add(d, alpha=value).cpu(), x.add(x, alpha=value), **TOL)
    # Zero and negative zero are two numbers.
    positive = torch.rand(4) + 1
    dp = positive.to("tpuc")
    assert not torch.signbit((dp * 0.0).cpu()).any() and torch.signbit((dp * -0.0).cpu()).all()
    # alpha= is a number where add takes it (not a tensor operand): one program per value.
    assert STATS["compiles"] == before + 3 + 1  # the new shape of `positive`
    # Numbers that shape what is computed stay part of the program, and stay right.
    for beta, threshold in ((1.0, 20.0), (2.0, 0.5)):
        torch.testing.assert_close(torch.nn.functional.softplus(d, beta, threshold).cpu(),
                                   torch.nn.functional.softplus(x, beta, threshold), **TOL)
    i = torch.arange(6).reshape(2, 3)
    for value in (0.5, 2.5):
        got = i.to("tpuc") * value
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.cpu(), i * value, **TOL)


def test_random_ops_on_the_device_follow_torch_manual_seed(mode):
    x = torch.ones(1000).to("tpuc")
    torch.manual_seed(1)
    first = torch.nn.functional.dropout(x, 0.5).cpu()
    torch.manual_seed(1)
    again = torch.nn.functional.dropout(x, 0.5).cpu()
    assert torch.equal(first, again)
    kept = (first != 0).float().mean().item()
    assert 0.4 < kept < 0.6 and set(first.unique().tolist()) == {0.0, 2.0}


def test_random_fills_follow_their_parameters(monkeypatch):
    # Two numbers each, both inputs of the op's program (one program for every value): each
    # must reach its own place (cauchy's median is not its scale).
    monkeypatch.setenv("TPUC_STRICT", "1")
    n = 40000
    cauchy = torch.empty(n, device="tpuc").cauchy_(2.0, 0.5).cpu()
    assert abs(cauchy.median().item() - 2.0) < 0.05
    assert abs((cauchy - 2.0).abs().median().item() - 0.5) < 0.05  # the scale is the median distance
    logs = torch.empty(n, device="tpuc").log_normal_(1.0, 0.5).cpu().log()
    assert abs(logs.mean().item() - 1.0) < 0.02 and abs(logs.std().item() - 0.5) < 0.02
    for dtype in (torch.float32, torch.int64):
        draws = torch.empty(n, device="tpuc", dtype=dtype).geometric_(0.3).cpu()
        assert draws.dtype == dtype and draws.min().item() == 1 and torch.equal(draws, draws.floor())
        assert abs(draws.double().mean().item() - 1 / 0.3) < 0.1
        for got in (torch.randint_like(torch.empty(n, device="tpuc", dtype=dtype), 3, 8),
                    torch.empty(n, device="tpuc", dtype=dtype).random_(3, 8)):
            assert got.dtype == dtype and set(got.cpu().tolist()) == {3, 4, 5, 6, 7}


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
                         env=dict(os.environ, TPUC_STRICT="1"))
    assert "cannot run on the tpuc device" in run.stdout and "TPUC_STRICT=1" in run.stdout, run.stdout + run.stderr


def test_linear_algebra_checks_its_results_as_on_the_cpu(monkeypatch):
    # The factorisation runs on the device; its error check reads `info` back, quietly, strict or not.
    monkeypatch.setenv("TPUC_STRICT", "1")
    a = torch.randn(3, 3)
    a = a @ a.T + torch.eye(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _same(torch.linalg.cholesky(a.to("tpuc")), torch.linalg.cholesky(a), rtol=1e-5, atol=1e-5)
        b, factor = torch.randn(2, 3, 2), torch.linalg.cholesky(a)  # broadcast over b's batch
        _same(torch.cholesky_solve(b.to("tpuc"), factor.to("tpuc")), torch.cholesky_solve(b, factor),
              rtol=1e-4, atol=1e-5)
        with pytest.raises(torch.linalg.LinAlgError, match="not positive-definite"):
            torch.linalg.cholesky(-a.to("tpuc"))


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


def test_strided_complex_tensors_are_read_and_written_in_place(monkeypatch):
    # Multi-dimensional FFTs transpose their complex intermediates; tpuc reads and writes a
    # strided complex tensor through its real pairs.
    monkeypatch.setenv("TPUC_STRICT", "1")
    x = torch.randn(4, 6)
    for f in (torch.fft.fft2, torch.fft.ifftn, torch.fft.hfft2, torch.fft.irfft2):
        _same(f(x.to("tpuc")), f(x), rtol=1e-4, atol=1e-5)
    c = torch.randn(4, 6, dtype=torch.complex64)
    d = c.to("tpuc")
    _same(d.t().contiguous(), c.t().contiguous())
    d.t()[1:3].mul_(2j)
    c.t()[1:3].mul_(2j)
    _same(d, c)


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
    _same(torch.special.hermite_polynomial_h(d, 3), torch.special.hermite_polynomial_h(x, 3))


def test_set_puts_a_tensor_over_another_storage():
    a = torch.arange(6.0)
    d = a.to("tpuc")
    over = torch.empty(0, device="tpuc").set_(d.untyped_storage(), 2, (2, 2), (1, 2))
    _same(over, a.as_strided((2, 2), (1, 2), 2))
    _same(torch.empty(0, device="tpuc").set_(d), a)
    assert torch.empty(3, device="tpuc").set_().shape == (0,)


def test_importing_tpuc_gives_the_device_and_stays_cheap():
    script = ("import sys, tpuc, torch\n"
              "print('tpuc.compiler' in sys.modules, torch._C._get_privateuse1_backend_name())\n"
              "print(torch.ones(2, device='tpuc').sum().item(), 'tpuc.compiler' in sys.modules)\n")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert run.returncode == 0, run.stderr[-2000:]
    # The compiler's modules come with the first op's compile, not with the import.
    assert run.stdout.split() == ["False", "tpuc", "2.0", "True"], run.stdout
    assert run.stderr == "", run.stderr


def test_import_torch_alone_gives_the_device_unless_autoload_is_off(tmp_path):
    script = ("import torch\n"
              "x = torch.arange(4.0, device='tpuc') * 2\n"
              "print(x.device, x.sum().item(), torch.tpuc.is_available())\n")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["tpuc:0", "12.0", "True"] and run.stderr == "", run
    # torch's switch for device backends' autoload turns the device off with the others.
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         env=dict(env, TORCH_DEVICE_BACKEND_AUTOLOAD="0"), cwd=tmp_path)
    assert run.returncode != 0 and "tpuc" in run.stderr.splitlines()[-1], run.stderr[-2000:]


def test_a_program_on_the_device_runs_and_exits_cleanly_from_anywhere(tmp_path):
    script = ("import torch\nx = torch.ones(2, device='tpuc')\nm = torch.nn.Linear(2, 2).to('tpuc')\n"
              "m(x).sum().backward()\nprint(x + 1)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env=dict(env, TF_CPP_MIN_LOG_LEVEL="3"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout == "tensor([2., 2.], device='tpuc:0')\n" and run.stderr == "", run.stderr[-3000:]


def test_the_op_cache_says_what_it_did():
    before = torch.tpuc.cache_stats()
    x = torch.randn(3, 3).to("tpuc")
    x.atan2(x)                      # a new key: planned
    x.atan2(x)                      # a hit
    x[:2].atan2(x[:2])              # the op again, other shapes: planned
    x.clamp(min=0.25)               # a number the op takes as a number...
    x.clamp(min=0.5)                # ...so another value is another plan
    after = torch.tpuc.cache_stats()
    assert after["misses"] - before["misses"] == after["plans"] - before["plans"] >= 4
    assert after["hits"] - before["hits"] >= 1
    assert after["requests"] - before["requests"] == (after["hits"] + after["misses"]) - (before["hits"] + before["misses"])
    assert after["plan_seconds"] > before["plan_seconds"]
    assert after["entries"] >= 4


def test_results_torch_allocates_for_an_op_cost_no_copy_from_the_host(mode):
    """torch runs `x + y` as `add.out` into a tensor it has just made: that storage was never
    written, and its program makes the zeros it stands for rather than taking them uploaded."""
    x, y = torch.randn(64, 64).to("tpuc"), torch.randn(64, 64).to("tpuc")
    for _ in range(2):  # planned, then from the cache
        before = torch.tpuc.cache_stats()
        z = (x + y) * y - x
        out = torch.empty(64, 64, device="tpuc")
        torch.mul(z, 2, out=out)
        _same(out, ((x.cpu() + y.cpu()) * y.cpu() - x.cpu()) * 2)
        after = torch.tpuc.cache_stats()
        # What reached the device from the host: at most the numbers the ops take (`2`).
        assert after["uploaded_bytes"] - before["uploaded_bytes"] < 64, (before, after)
    # A storage never written still reads as zeros where an op reads it.
    partly = torch.empty(2, 3, device="tpuc")
    partly[0].fill_(2.0)
    _same(partly[0], torch.full((3,), 2.0))


@pytest.mark.parametrize("case", ["plain", "causal", "boolean mask", "grouped query"])
def test_attention_is_one_op_and_trains_as_on_the_cpu(case):
    """scaled_dot_product_attention picks its kernel as the CPU does: the flash kernel, one
    program per shapes (the math composite would be nine), or the composite where flash does not
    apply (grouped-query attention)."""
    torch.manual_seed(0)
    kv_heads, keys = (2, 7) if case == "grouped query" else (4, 5 if case == "causal" else 7)
    q = torch.randn(2, 4, 5, 8, requires_grad=True)
    k, v = (torch.randn(2, kv_heads, keys, 8, requires_grad=True) for _ in range(2))
    mask = None
    if case == "boolean mask":
        mask = torch.rand(2, 1, 5, keys) > 0.3
        mask[..., 0] = True

    def attend(q, k, v, mask):
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=case == "causal", enable_gqa=case == "grouped query")
        out.square().sum().backward()
        return out

    expected = attend(q, k, v, mask)
    on_device = [t.detach().to("tpuc").requires_grad_() for t in (q, k, v)]
    forward_plans = planner.STATS["plans"]
    with torch.no_grad():  # (planned here, before the run below: what attention alone plans)
        torch.nn.functional.scaled_dot_product_attention(
            *on_device, attn_mask=None if mask is None else mask.to("tpuc"), is_causal=case == "causal",
            enable_gqa=case == "grouped query")
    if case != "grouped query":
        # The kernel, and a boolean mask made additive (logical_not, where and its -inf).
        assert planner.STATS["plans"] - forward_plans == (1 if mask is None else 4)
    got = attend(*on_device, None if mask is None else mask.to("tpuc"))
    _same(got, expected)
    for tensor, cpu_tensor in zip(on_device, (q, k, v)):
        _same(tensor.grad, cpu_tensor.grad, rtol=1e-4, atol=1e-5)


STRIDED_VIEWS = {
    "transpose": lambda x: x.transpose(0, 2), "permute": lambda x: x.permute(1, 2, 0),
    "slice": lambda x: x[:, 1:4, 2:7], "every other": lambda x: x[..., ::2],
    "strided transpose": lambda x: x[:, ::3].transpose(1, 2), "tail": lambda x: x[2:, :, 5:],
    "element": lambda x: x[1, 2, 3], "broadcast": lambda x: x[:, :1].expand(4, 5, 8),
}


@pytest.mark.parametrize("view", STRIDED_VIEWS)
def test_strided_views_are_read_and_written_without_gathers(view):
    """A transposed weight, a slice, every other element: read and written as a box of the
    storage (reshape, slice, transpose), not by the gather and scatter of `as_strided`."""
    take = STRIDED_VIEWS[view]
    base = torch.randn(4, 6, 8)
    on_device = base.to("tpuc")
    graphs = len(planner._GRAPHS)
    _same(take(on_device).exp(), take(base).exp())
    if view != "broadcast":  # (a broadcast view has no elements of its own to write)
        take(on_device).mul_(3)
        take(base).mul_(3)
        _same(on_device, base)
    for gm in planner._GRAPHS[graphs:]:
        strided = [n for n in gm.graph.nodes if "as_strided" in str(n.target)]
        assert not strided, gm.code


def _on_device(value):
    if isinstance(value, list):
        return [v.to("tpuc") for v in value]
    return value.to("tpuc")


@pytest.mark.parametrize("eager_mode", ["strict", "debug", "fused", "compiled"])
@pytest.mark.parametrize("name", ["llama", "qwen", "resnet18", "dlrm", "mingpt", "unet"])
def test_the_zoo_runs_on_the_device_as_on_the_cpu(name, eager_mode):
    from models import zoo
    _set_mode("strict" if eager_mode == "compiled" else eager_mode)
    try:
        _zoo_forward(zoo, name, compiled=eager_mode == "compiled")
    finally:
        _set_mode("strict")


def _zoo_forward(zoo, name, compiled: bool = False):
    model, inputs = next((m, i) for n, m, i in zoo() if n == name)
    with torch.no_grad():
        expected = model(*inputs)
        on_device = copy.deepcopy(model).to("tpuc")
        if compiled:
            on_device = torch.compile(on_device, backend="tpuc", options={"strict": True})
        got = on_device(*[_on_device(i) for i in inputs])
    assert got.device.type == "tpuc"
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["llama", "qwen", "resnet18", "dlrm", "mingpt", "unet"])
def test_the_zoo_trains_on_the_device_as_on_the_cpu(name):
    from zoo_training import assert_trains_as_on_the_cpu
    assert_trains_as_on_the_cpu(name, "tpuc")


@pytest.mark.parametrize("name", ["llama", "mingpt"])
def test_the_zoos_language_models_train_in_fused_mode_as_on_the_cpu(name):
    from zoo_training import assert_trains_as_on_the_cpu
    _set_mode("fused")
    try:
        assert_trains_as_on_the_cpu(name, "tpuc", steps=3)
    finally:
        _set_mode("strict")


def test_debug_mode_finds_the_first_op_that_goes_wrong(monkeypatch):
    from tpuc import _tpuc_native
    x = torch.randn(7).to("tpuc")
    # A wrong program for one op: sin computed by cos's.
    real = planner._program_plan

    def perturbed(func, flat, spec, signature, device, call=None, counted=None, stored=None):
        if func == torch.ops.aten.sin.out:
            call = torch.ops.aten.cos.out
        return real(func, flat, spec, signature, device, call=call, counted=counted)

    monkeypatch.setattr(planner, "_program_plan", perturbed)
    monkeypatch.setattr(plan_store, "directory", lambda: None)  # planned here, not revived or kept
    _tpuc_native.clear_cache()
    try:
        device.debug(compare=True)
        y = x * 2  # right: passes
        with pytest.raises(tpuc.TpucError,
                           match=r"aten\.sin\.out differs from the CPU's result by .*test_device\.py:\d+: .*y\.sin\(\)"):
            y.sin()
        device.debug(finite=True)
        zero = torch.zeros(7).to("tpuc")
        with pytest.raises(tpuc.TpucError, match=r"aten\.div\.out made a NaN or an infinity from finite inputs"):
            x / zero
    finally:
        device.debug(False)
        _tpuc_native.clear_cache()
    # Strict mode again: nothing is checked.
    assert torch.isinf((x / torch.zeros(7).to("tpuc")).cpu()).all()


@pytest.fixture
def fused():
    _set_mode("fused")
    yield
    _set_mode("strict")


def test_fused_mode_runs_recorded_ops_as_one_program_per_structure(fused):
    x = torch.randn(16, 16)
    d = x.to("tpuc")
    for step in (0.0, 1.0):  # the ops' own programs, planned once
        y = d
        for _ in range(10):
            y = (y * 0.5 + step).sin()
        y.sum().item()
    before, compiles = torch.tpuc.cache_stats(), STATS["compiles"]
    for step in (0.0, 1.0, 2.0, 3.0):
        y, z = d, x
        for _ in range(10):
            y, z = (y * 0.5 + step).sin(), (z * 0.5 + step).sin()
        # Nothing ran yet: the values are pending until one is read.
        assert _tpuc_native.cache_stats()["hits"] > before["hits"]
        torch.testing.assert_close(y.sum().item(), z.sum().item(), rtol=1e-5, atol=1e-5)
    after = torch.tpuc.cache_stats()
    # One program served the four runs (the step's number is an input of it), planned by none.
    assert after["fused_runs"] - before["fused_runs"] == 4
    assert after["fused_misses"] == before["fused_misses"] and after["fused_hits"] - before["fused_hits"] == 4
    assert STATS["compiles"] == compiles and after["plans"] == before["plans"]
    # synchronize runs what was recorded; views and in-place ops through them are recorded too.
    runs = torch.tpuc.cache_stats()["fused_runs"]
    base = torch.zeros(4, 4, device="tpuc")
    base[:, 1].add_(2)
    base.t()[0] += 1
    torch.tpuc.synchronize()
    expected = torch.zeros(4, 4)
    expected[:, 1] += 2
    expected.t()[0] += 1
    assert torch.equal(base.cpu(), expected)
    assert torch.tpuc.cache_stats()["fused_runs"] == runs + 1
    # A run ends after max_ops ops.
    device.fused(max_ops=4)
    runs = torch.tpuc.cache_stats()["fused_runs"]
    y = d
    for _ in range(12):
        y = y + 1
    torch.testing.assert_close(y.cpu(), x + 12)
    assert torch.tpuc.cache_stats()["fused_runs"] - runs == 3
    with pytest.raises(tpuc.TpucError, match="max_ops must be a positive integer, not 0"):
        device.fused(max_ops=0)


def test_a_fused_run_whose_values_are_all_gone_runs_nothing(fused):
    x = torch.randn(8).to("tpuc")
    before = torch.tpuc.cache_stats()
    y = (x * 2).exp()
    del y
    torch.tpuc.synchronize()
    after = torch.tpuc.cache_stats()
    assert after["fused_runs"] == before["fused_runs"] + 1
    assert (after["fused_hits"], after["fused_misses"]) == (before["fused_hits"], before["fused_misses"])


_PLANNED_TWICE = """
import json, torch, tpuc, tpuc.device
from tpuc.planner import STATS
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).to("tpuc")
x = torch.randn(3, 4).to("tpuc")
loss = model(x).square().mean()
loss.backward()
weight = model[0].weight.detach().clone()
weight.mul_(0.5).add_(1.0)
picked = torch.nonzero(x > 0)
strict = dict(STATS)
tpuc.device.fused()
fused = (x * 2 + 1).sin().sum(0)
torch.tpuc.synchronize()
print(json.dumps({"values": [loss.item(), model[0].weight.grad.cpu().tolist(), weight.cpu().tolist(),
                             picked.cpu().tolist(), fused.cpu().tolist()],
                  "strict": strict, "stats": STATS}))
"""


def test_a_second_process_revives_the_devices_plans_and_fused_runs_from_disk(tmp_path):
    env = dict(os.environ, TPUC_CACHE_DIR=str(tmp_path / "cache"), TF_CPP_MIN_LOG_LEVEL="3")

    def run():
        done = subprocess.run([sys.executable, "-c", _PLANNED_TWICE], capture_output=True, text=True, timeout=300,
                              env=env, cwd=tmp_path)
        assert done.returncode == 0 and done.stderr == "", done.stderr[-3000:]
        return json.loads(done.stdout)

    first, second = run(), run()
    assert first["values"] == second["values"]
    assert first["stats"]["plans"] > 10 and first["stats"]["plans_from_disk"] == 0
    assert first["stats"]["fused_runs_planned"] >= 1 and first["stats"]["fused_runs_from_disk"] == 0
    # Nothing traced or lowered again: every op's plan and the fused run's program came from disk.
    assert second["stats"]["plans_from_disk"] == second["stats"]["plans"] == first["stats"]["plans"]
    assert second["stats"]["fused_runs_from_disk"] == second["stats"]["fused_runs_planned"] >= 1
    assert second["strict"]["loaded_from_disk"] == second["strict"]["plans"]

    # Damaged plans (cut short, bytes changed) are planned again, with the same results, and replaced.
    plans = sorted((tmp_path / "cache" / "device-plans").glob("*.plan"))
    assert len(plans) >= first["stats"]["plans"] // 2
    for k, path in enumerate(plans):
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2] if k % 2 else data[:-1] + bytes([data[-1] ^ 1]))
    third, fourth = run(), run()
    assert third["values"] == first["values"] and fourth["values"] == first["values"]
    assert third["stats"]["plans_from_disk"] == 0 and third["stats"]["fused_runs_from_disk"] == 0
    assert fourth["stats"]["plans_from_disk"] == fourth["stats"]["plans"]

    # With the compile cache off, nothing is kept and nothing is said.
    env["TPUC_CACHE_DIR"] = "off"
    assert run()["values"] == first["values"]


def test_the_dump_directory_records_the_devices_programs_and_cache(tmp_path):
    script = ("import torch, tpuc\n"
              "x = torch.arange(6.0).to('tpuc')\n"
              "print((x * 2).sum().item())\n")
    dump = tmp_path / "dump"
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, TPUC_DUMP_DIR=str(dump), TF_CPP_MIN_LOG_LEVEL="3"))
    assert run.returncode == 0, run.stderr[-2000:]
    stats = json.loads((dump / "device_cache_stats.json").read_text())
    assert stats["misses"] >= 2 and stats["plans"] >= 2
    names = {p.name for p in dump.iterdir()}
    assert any(n.startswith("eager_mul") and n.endswith(".mlir") for n in names), names


def test_compare_names_the_first_node_of_a_compiled_graph_that_diverges(monkeypatch):
    from tpuc.compiler import GraphCompiler
    from tpuc.graph import copy_module

    def forward(x):
        y = (x * 3).relu()
        z = y.sin() + 1
        return z.sum(-1)

    x = torch.randn(5, 3, requires_grad=True)
    # Right: every call is checked, forward and backward, and nothing is said.
    compiled = torch.compile(forward, backend="tpuc", options={"compare": True})
    compiled(x).sum().backward()
    torch.testing.assert_close(x.grad, (3 * (x > 0) * (3 * x).relu().cos()).detach(), **TOL)
    # A wrong lowering of one op, for the compiled graph and for the device alike.
    real = GraphCompiler.prepare

    def perturbed(self, gm, name, *args, **kwargs):
        gm = copy_module(gm)
        for node in gm.graph.nodes:
            if node.target == torch.ops.aten.sin.default:
                node.target = torch.ops.aten.cos.default
        gm.recompile()
        return real(self, gm, name, *args, **kwargs)

    monkeypatch.setattr(GraphCompiler, "prepare", perturbed)
    torch._dynamo.reset()
    compiled = torch.compile(forward, backend="tpuc", options={"compare": {"rtol": 1e-3, "atol": 1e-4}})
    with pytest.raises(tpuc.TpucError, match=r"node sin \(aten\.sin\.default\) differs from PyTorch's on the "
                                             r"CPU by .*, at .*test_device\.py:\d+"):
        compiled(x.detach())
    for bad in ("yes", {"rtol": -1}, {"tolerance": 1}):
        with pytest.raises(ValueError, match="compare must be True, False or"):
            tpuc.Options.parse({"compare": bad})


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


def graph_break_fn(x, y):
    a = torch.sin(x) * 2 + torch.arange(3, device=x.device)
    if a.sum() > 0:  # a branch on a value: the graph breaks here
        a = a * 3
    y.add_(1)  # an input updated in place
    return a.cumsum(0) + y, torch.nonzero(a > 0)


@pytest.mark.filterwarnings("ignore:tpuc. aten.nonzero")
def test_torch_compile_graph_breaks_run_on_the_device(mode):
    x, y = torch.randn(4, 3), torch.randn(4, 3)
    want = graph_break_fn(x.clone(), y.clone())
    x_on_device, y_on_device = x.to("tpuc"), y.to("tpuc")
    got = torch.compile(graph_break_fn, backend="tpuc")(x_on_device, y_on_device)
    assert all(g.device.type == "tpuc" for g in got)
    torch.testing.assert_close(got[0].cpu(), want[0], **TOL)
    assert torch.equal(got[1].cpu(), want[1])
    torch.testing.assert_close(y_on_device.cpu(), y + 1, **TOL)


def test_a_graph_break_runs_its_eager_part_on_the_device():
    def fn(x, y):
        z = x.sin() * 2
        if z.sum() > 0:          # a value read: Dynamo breaks the graph here
            return z + y
        return z - y

    x, y = torch.randn(4, 4), torch.randn(4, 4)
    got = torch.compile(fn, backend="tpuc")(x.to("tpuc"), y.to("tpuc"))
    _same(got, fn(x, y))


def test_torch_compile_over_device_tensors_falls_back_compares_and_refuses_clearly():
    def unsupported(v):
        return torch.tanh(torch.linalg.matrix_exp(v.view(-1, 1, 1)).view(-1) + 1) * 3  # not lowered by tpuc

    x = torch.randn(5)
    x_on_device = x.to("tpuc")
    # An op tpuc cannot lower runs on the device op by op (there, on the CPU), with one warning.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = torch.compile(unsupported, backend="tpuc")(x_on_device)
    torch.testing.assert_close(got.cpu(), unsupported(x), **TOL)
    assert got.device.type == "tpuc"
    assert any("aten.linalg_matrix_exp.default" in str(w.message) for w in caught), [str(w.message) for w in caught]
    # The compare option checks a graph over the device's tensors against the CPU as well.
    compared = torch.compile(lambda v: torch.sin(v) * v, backend="tpuc", options={"compare": True})
    torch.testing.assert_close(compared(x_on_device).cpu(), torch.sin(x) * x, **TOL)
    with pytest.raises(Exception, match=r"same device"):
        torch.compile(lambda a, b: a + b, backend="tpuc")(x_on_device, torch.randn(5))
    with pytest.raises(tpuc.TpucError, match=r"got a tensor of the meta device"):
        tpuc.device.graph_argument(torch.empty(2, device="meta"), None, 0)


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


def test_pinned_host_memory_and_non_blocking_copies():
    x = torch.randn(8, 8)
    pinned = x.pin_memory()
    assert pinned.is_pinned() and not x.is_pinned() and pinned[2:].is_pinned()
    d = pinned.to("tpuc", non_blocking=True)
    back = torch.empty(8, 8).pin_memory()
    back.copy_(d * 2, non_blocking=True)
    torch.tpuc.synchronize()
    assert torch.equal(back, x * 2)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x), batch_size=4, pin_memory=True)
    batches = [batch.to("tpuc", non_blocking=True) for (batch,) in loader]
    assert all(batch.device.type == "tpuc" for batch in batches)
    _same(torch.cat(batches), x)


def test_device_tensors_pickle_copy_and_are_weakly_referenced(tmp_path):
    import io
    import pickle
    import weakref

    x = torch.randn(3, 4)
    d = x.to("tpuc")
    buffer = io.BytesIO()
    torch.save({"d": d, "view": d[1:]}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)
    _same(loaded["d"], x)
    _same(loaded["view"], x[1:])
    buffer.seek(0)
    on_cpu = torch.load(buffer, map_location="cpu")
    assert on_cpu["d"].device.type == "cpu" and torch.equal(on_cpu["d"], x)
    _same(pickle.loads(pickle.dumps(d)), x)
    copied = copy.deepcopy(d)
    copied.add_(1)
    _same(d, x)
    _same(copied, x + 1)
    ref = weakref.ref(d)
    assert ref() is d
    del d, loaded, copied
    assert ref() is None


def test_dlpack_shares_a_device_tensor_as_on_cuda():
    from torch.utils.dlpack import DLDeviceType

    x = torch.arange(6.0).reshape(2, 3)
    d = x.to("tpuc")
    assert d.__dlpack_device__() == (DLDeviceType.kDLExtDev, 0)
    shared = torch.from_dlpack(d)
    assert shared.device == d.device and shared.data_ptr() == d.data_ptr()
    shared.add_(1)                                     # the same storage
    _same(d, x + 1)
    _same(torch.from_dlpack(d.t()), (x + 1).t())       # a view, its strides kept
    assert torch.equal(torch.from_dlpack(d, device="cpu"), x + 1)
    with pytest.raises(RuntimeError, match="Unsupported device"):
        import numpy
        numpy.from_dlpack(d)                           # as numpy refuses a CUDA tensor
    with pytest.raises(RuntimeError, match="starts inside its storage"):
        torch.from_dlpack(d[1]).cpu()


def test_moving_a_module_keeps_its_parameters_and_their_ties():
    embedding = torch.nn.Embedding(8, 4)
    head = torch.nn.Linear(4, 8, bias=False)
    head.weight = embedding.weight                     # tied, as language models tie them
    model = torch.nn.ModuleDict({"embedding": embedding, "head": head})
    parameter = embedding.weight
    model.to("tpuc")
    assert model["head"].weight is model["embedding"].weight is parameter
    assert parameter.device.type == "tpuc" and len(list(model.parameters())) == 1
