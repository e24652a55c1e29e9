"""`torch.tpuc`, the device's module, as PyTorch's accelerator API and libraries use it (as they
use `torch.cuda`): devices and the current one, streams and events, random states, the device's
name and properties."""
import copy

import pytest
import torch

import tpuc  # noqa: F401 (registers the device)


def test_the_current_device_is_chosen_by_index_name_or_device():
    assert torch.tpuc.device_count() == 1 and torch.tpuc.current_device() == 0
    for given in (0, "tpuc", "tpuc:0", torch.device("tpuc", 0)):
        torch.tpuc.set_device(given)
        assert torch.tpuc.current_device() == 0
    with torch.tpuc.device("tpuc:0") as chosen:
        assert chosen.index == 0 and torch.tpuc.current_device() == 0
    with torch.tpuc.device(None):
        assert torch.tpuc.current_device() == 0


@pytest.mark.parametrize("given, error, said", [
    (1, RuntimeError, "there is no device tpuc:1: the tpuc device has 1 device(s), tpuc:0 to tpuc:0"),
    ("tpuc:3", RuntimeError, "there is no device tpuc:3"),
    (-1, RuntimeError, "there is no device tpuc:-1"),
    ("cuda:0", ValueError, "cuda:0 is not a tpuc device"),
    (1.5, TypeError, "a device is an index, 'tpuc:N' or a torch.device"),
])
def test_a_device_that_is_not_there_is_refused_by_name(given, error, said):
    with pytest.raises(error) as raised:
        torch.tpuc.set_device(given)
    assert said in str(raised.value)
    with pytest.raises(error):
        torch.tpuc.get_rng_state(given)
    assert torch.tpuc.current_device() == 0


def test_timed_events_measure_the_work_between_them():
    x = torch.randn(256, 256, device="tpuc")
    stream = torch.tpuc.current_stream()
    assert stream == torch.tpuc.default_stream() and stream.device == torch.device("tpuc", 0)
    start, end = torch.tpuc.Event(enable_timing=True), torch.tpuc.Event(enable_timing=True)
    with torch.tpuc.stream(stream):
        start.record()
        for _ in range(3):
            x = x @ x / 256
        end.record()
    end.synchronize()
    assert start.query() and end.query() and stream.query()
    assert start.elapsed_time(end) >= 0
    # Waits between streams hold already: every stream is the device's one queue.
    other = torch.tpuc.Stream()
    other.wait_stream(stream)
    other.wait_event(stream.record_event())
    # Streams are torch.Streams: libraries (FSDP2) read their ids and device.
    assert isinstance(other, torch.Stream) and (other.stream_id, other.device_index) == (0, 0)
    assert other.device_type == int(torch._C._autograd.DeviceType.PrivateUse1)
    torch.tpuc.synchronize()
    assert torch.isfinite(x).all()
    with pytest.raises(RuntimeError, match="enable_timing=True"):
        torch.tpuc.Event().elapsed_time(end)
    with pytest.raises(RuntimeError, match="recorded"):
        torch.tpuc.Event(enable_timing=True).elapsed_time(end)


def test_storages_resize_keeping_what_they_still_cover():
    # FSDP2 frees a parameter's unsharded storage (resize to 0) and allocates it again.
    t = torch.arange(6.0, device="tpuc")
    storage = t.untyped_storage()
    storage.resize_(40)
    assert storage.nbytes() == 40 and torch.equal(t.cpu(), torch.arange(6.0))
    storage.resize_(8)
    assert torch.equal(torch.empty(0, device="tpuc").set_(storage).cpu(), torch.arange(2.0))
    storage.resize_(0)
    assert storage.nbytes() == 0
    storage.resize_(12)
    again = torch.empty(0, device="tpuc").set_(storage)
    again.copy_(torch.tensor([7.0, 8.0, 9.0]))
    assert torch.equal(again.cpu(), torch.tensor([7.0, 8.0, 9.0]))


def test_random_states_are_saved_and_restored_as_torch_does_it():
    torch.tpuc.manual_seed(3)
    assert torch.tpuc.initial_seed() == 3
    state = torch.tpuc.get_rng_state()
    first = torch.rand(8, device="tpuc").cpu()
    torch.tpuc.set_rng_state(state)
    assert torch.equal(torch.rand(8, device="tpuc").cpu(), first)
    states = torch.tpuc.get_rng_state_all()
    with torch.random.fork_rng(device_type="tpuc"):
        torch.rand(8, device="tpuc")
    torch.tpuc.set_rng_state_all(states)
    again = torch.rand(8, device="tpuc").cpu()
    torch.tpuc.set_rng_state(state)
    assert torch.equal(torch.rand(8, device="tpuc").cpu(), first)
    assert not torch.equal(again, first)
    # The state is a seed and an offset, as CUDA's Philox state: DTensor's random ops read it
    # and move the offset, and the device's draws follow the offset.
    from torch.distributed.tensor._random import _PhiloxState

    philox = _PhiloxState(torch.tpuc.get_rng_state())
    assert state.dtype == torch.uint8 and state.numel() == 16 and philox.seed.item() == 3
    philox.offset = philox.offset + 4
    torch.tpuc.set_rng_state(philox.state)
    assert not torch.equal(torch.rand(8, device="tpuc").cpu(), first)
    # torch.manual_seed seeds the device too; the CPU's generator is not the device's.
    torch.manual_seed(5)
    on_device = torch.rand(8, device="tpuc").cpu()
    torch.rand(100)
    torch.manual_seed(5)
    torch.randn(3)
    assert torch.equal(torch.rand(8, device="tpuc").cpu(), on_device)
    with pytest.raises(RuntimeError, match="16 bytes"):
        torch.tpuc.set_rng_state(torch.default_generator.get_state())


def test_the_device_names_itself_and_its_memory():
    name = torch.tpuc.get_device_name()
    properties = torch.tpuc.get_device_properties("tpuc:0")
    assert name == properties.name == "tpuc (cpu via PJRT)"
    assert properties.platform == "cpu" and properties.index == 0
    free, total = torch.tpuc.mem_get_info()
    assert 0 < free <= total == properties.total_memory
    assert torch.tpuc.is_available() and torch.tpuc.is_initialized()
    assert "requests" in torch.tpuc.cache_stats()
    assert torch.accelerator.current_accelerator() == torch.device("tpuc")
    assert torch.get_device_module("tpuc") is torch.tpuc


def test_memory_statistics_follow_the_tensors_on_the_device():
    torch.tpuc.synchronize()
    before = torch.tpuc.memory_allocated()
    torch.tpuc.reset_peak_memory_stats()
    assert torch.tpuc.max_memory_allocated() == before
    x = torch.zeros(1024, 256, device="tpuc")  # 1 MiB
    y = x + 1
    torch.tpuc.synchronize()
    held = torch.tpuc.memory_allocated()
    assert held >= before + 2 * 2**20
    del x, y
    import gc

    gc.collect()
    assert torch.tpuc.memory_allocated() <= held - 2 * 2**20
    assert torch.tpuc.max_memory_allocated() >= held
    stats = torch.tpuc.memory_stats()
    assert stats["allocated_bytes.all.current"] == torch.tpuc.memory_allocated() == torch.tpuc.memory_reserved()
    assert stats["allocated_bytes.all.peak"] == torch.tpuc.max_memory_allocated()
    torch.tpuc.reset_peak_memory_stats("tpuc:0")
    assert torch.tpuc.max_memory_allocated() == torch.tpuc.memory_allocated()
    torch.tpuc.empty_cache()
    with pytest.raises(RuntimeError, match="no device tpuc:1"):
        torch.tpuc.memory_allocated(1)


def test_autocast_runs_matmuls_low_and_reductions_in_float32_as_cuda_does():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 5))
    x, target = torch.randn(8, 16), torch.randint(0, 5, (8,))

    def step(model, x, target, autocast):
        with autocast:
            logits = model(x)
            log_probs = torch.log_softmax(logits, -1)
            loss = torch.nn.functional.nll_loss(log_probs, target)
        loss.backward()
        return logits, log_probs, loss, [p.grad for p in model.parameters()]

    on_device = copy.deepcopy(model).to("tpuc")
    logits, log_probs, loss, grads = step(on_device, x.to("tpuc"), target.to("tpuc"),
                                          torch.autocast("tpuc", dtype=torch.bfloat16))
    assert (logits.dtype, log_probs.dtype, loss.dtype) == (torch.bfloat16, torch.float32, torch.float32)
    assert all(g.dtype == torch.float32 for g in grads)

    # The same policy spelled out on the CPU: the linear layers in bfloat16, the rest as given.
    class Low(torch.nn.Module):
        def __init__(self, linear):
            super().__init__()
            self.linear = linear

        def forward(self, x):
            return torch.nn.functional.linear(x.bfloat16(), self.linear.weight.bfloat16(),
                                              self.linear.bias.bfloat16())

    reference = copy.deepcopy(model)
    spelled = torch.nn.Sequential(Low(reference[0]), torch.nn.ReLU(), Low(reference[2]))
    ref_logits = spelled(x)
    ref_log_probs = torch.log_softmax(ref_logits.float(), -1)
    ref_loss = torch.nn.functional.nll_loss(ref_log_probs, target)
    ref_loss.backward()
    torch.testing.assert_close(logits.cpu(), ref_logits, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(loss.cpu(), ref_loss, rtol=1e-3, atol=1e-3)
    for grad, ref in zip(grads, [p.grad for p in reference.parameters()]):
        torch.testing.assert_close(grad.cpu(), ref, rtol=2e-2, atol=2e-3)
    # Outside the region, as given.
    assert (on_device[0](x.to("tpuc"))).dtype == torch.float32
