"""torch.distributed on the tpuc device, one process per rank (run by test_device_distributed.py
under torchrun, gloo on 127.0.0.1): the process group picks the device's backend by itself, each
rank on its own device (`set_device(local_rank)`). Rank 0 prints one JSON line per program.

collectives  every collective on device tensors (views, several dtypes, async work, a rank using
             its other device too, the functional collectives) against the same collective on
             host tensors in a gloo group
training:MODEL[=DIR]  DDP, FSDP2 (resharding after forward or not) and tensor parallel (DTensor
             over `init_device_mesh("tpuc", ...)`) training of the MLP (`mlp`) or the zoo's Llama
             (`llama`) on the device, against the same steps on the CPU without
             torch.distributed; the FSDP2 model checkpointed in DIR (torch.distributed.checkpoint)
             and loaded again
mismatch     ranks calling all_reduce on tensors of different shapes: an error naming each call
mesh_2d      (four ranks) FSDP2 over one dimension of a 2 x 2 device mesh, tensor parallel over the
             other, against the CPU
"""
import datetime
import json
import os
import sys
import warnings

import torch
import torch.distributed as dist
from distributed_programs import MLP


def report(program: str, **figures) -> None:
    if dist.get_rank() == 0:
        print(json.dumps({"program": program, **figures}), flush=True)


def collectives(host_group) -> None:
    """Each collective's results on the device, compared exactly with gloo's on the host."""
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("tpuc", torch.tpuc.current_device())
    checked = []

    def same(name: str, run) -> None:
        """`run(device)` returns the tensors a collective wrote; both runs must agree exactly."""
        on_device = [t.cpu() for t in run(device, None)]
        on_host = run(torch.device("cpu"), host_group)
        assert all(d.dtype == h.dtype and torch.equal(d, h) for d, h in zip(on_device, on_host, strict=True)), \
            (name, on_device, on_host)
        checked.append(name)

    def data(dev, dtype=torch.float32, n=6, scale=1):
        return (torch.arange(n, dtype=torch.float64) * scale + 10 * rank).to(dtype).to(dev)

    def all_reduce(dev, group):
        outs = []
        for dtype, op in ((torch.float32, dist.ReduceOp.SUM), (torch.int64, dist.ReduceOp.MAX),
                          (torch.bfloat16, dist.ReduceOp.SUM), (torch.float32, dist.ReduceOp.PRODUCT)):
            x = data(dev, dtype)
            dist.all_reduce(x, op=op, group=group)
            outs.append(x)
        return outs

    def all_gather(dev, group):
        outs = [torch.empty(6, device=dev) for _ in range(world)]
        dist.all_gather(outs, data(dev), group=group)
        flat = torch.empty(6 * world, device=dev)
        dist.all_gather_into_tensor(flat, data(dev), group=group)
        return outs + [flat]

    def reduce_scatter(dev, group):
        out = torch.empty(3, device=dev)
        dist.reduce_scatter_tensor(out, data(dev, n=3 * world), group=group)
        outs = [torch.empty(2, device=dev)]
        dist.reduce_scatter(outs[0], [data(dev, n=2, scale=r + 1) for r in range(world)], group=group)
        return [out] + outs

    def rooted(dev, group):
        b = data(dev)
        dist.broadcast(b, src=1, group=group)
        r = data(dev)
        dist.reduce(r, dst=0, group=group)
        gathered = [torch.empty(6, device=dev) for _ in range(world)] if rank == 0 else None
        dist.gather(data(dev), gathered, dst=0, group=group)
        scattered = torch.empty(6, device=dev)
        dist.scatter(scattered, [data(dev, scale=r + 2) for r in range(world)] if rank == 1 else None, src=1,
                     group=group)
        # A reduce's input on the other ranks is unspecified afterwards (gloo uses it as scratch).
        return [b, scattered] + ([r] + gathered if rank == 0 else [])

    def all_to_all(dev, group):
        even = torch.empty(2 * world, device=dev)
        dist.all_to_all_single(even, data(dev, n=2 * world), group=group)
        # Uneven splits: rank r sends r + 1 + i elements to rank i.
        sizes_in = [rank + 1 + i for i in range(world)]
        sizes_out = [r + 1 + rank for r in range(world)]
        uneven = torch.empty(sum(sizes_out), device=dev)
        dist.all_to_all_single(uneven, data(dev, n=sum(sizes_in)), sizes_out, sizes_in, group=group)
        lists = [torch.empty(2, device=dev) for _ in range(world)]
        dist.all_to_all(lists, [data(dev, n=2, scale=i + 1) for i in range(world)], group=group)
        return [even, uneven] + lists

    def point_to_point(dev, group):
        got = torch.empty(4, device=dev)
        peer = 1 - rank
        if rank == 0:
            dist.send(data(dev, n=4), dst=peer, group=group)
            dist.recv(got, src=peer, group=group)
        else:
            dist.recv(got, src=peer, group=group)
            dist.send(data(dev, n=4), dst=peer, group=group)
        sent = dist.isend(data(dev, n=4, scale=3), dst=peer, group=group)
        again = torch.empty(4, device=dev)
        received = dist.irecv(again, src=peer, group=group)
        sent.wait()
        received.wait()
        return [got, again]

    def async_work(dev, group):
        x = data(dev)
        work = dist.all_reduce(x, group=group, async_op=True)
        assert work.wait()
        result = work.get_future().wait()
        assert len(result) == 1 and result[0] is x or torch.equal(result[0].cpu(), x.cpu())
        return [x]

    def coalesced(dev, group):
        a, b = data(dev), data(dev, n=3, scale=2)
        with dist._coalescing_manager(group=group):
            dist.all_reduce(a, group=group)
            dist.all_reduce(b, group=group)
        gathered = [torch.empty(4 * world, device=dev), torch.empty(2 * world, device=dev)]
        with dist._coalescing_manager(group=group):
            dist.all_gather_into_tensor(gathered[0], data(dev, n=4), group=group)
            dist.all_gather_into_tensor(gathered[1], data(dev, n=2, scale=3), group=group)
        scattered = [torch.empty(2, device=dev), torch.empty(1, device=dev)]
        with dist._coalescing_manager(group=group):
            dist.reduce_scatter_tensor(scattered[0], data(dev, n=2 * world), group=group)
            dist.reduce_scatter_tensor(scattered[1], data(dev, n=world, scale=5), group=group)
        return [a, b] + gathered + scattered

    same("all_reduce", all_reduce)
    same("coalesced all_reduce, all_gather_into_tensor, reduce_scatter_tensor", coalesced)
    same("all_gather", all_gather)
    same("reduce_scatter", reduce_scatter)
    same("broadcast, reduce, gather, scatter", rooted)
    same("all_to_all", all_to_all)
    same("send, recv, isend, irecv", point_to_point)
    same("async work", async_work)

    # A collective writing a view in the middle of a larger tensor leaves the rest alone (gloo
    # itself reads a non-contiguous host tensor as if it were contiguous: not compared with it).
    whole = torch.zeros(3, 4, device=device)
    whole[:, 1] = data(device, n=3)
    dist.all_reduce(whole[:, 1])
    expected = torch.zeros(3, 4)
    expected[:, 1] = sum(torch.arange(3.) + 10 * r for r in range(world))
    assert torch.equal(whole.cpu(), expected), whole
    checked.append("all_reduce into a view")

    # A sum of pre-multiplied tensors (FSDP2's gradient reduction with a divide factor), which gloo
    # does not have: the backend multiplies, gloo sums.
    premul = [dist._make_nccl_premul_sum(0.25), dist._make_nccl_premul_sum(torch.tensor(0.5, device=device))]
    out = torch.empty(3, device=device)
    dist.reduce_scatter_tensor(out, data(device, n=3 * world), op=premul[0])
    summed = sum(torch.arange(3 * world, dtype=torch.float32) + 10 * r for r in range(world))
    assert torch.equal(out.cpu(), (0.25 * summed)[3 * rank:3 * rank + 3]), out
    x = data(device)
    dist.all_reduce(x, op=premul[1])
    assert torch.equal(x.cpu(), 0.5 * sum(torch.arange(6.) + 10 * r for r in range(world))), x
    checked.append("premul_sum")

    # The rank's other device: the backend reads and writes tensors of whichever device they are on.
    other = torch.device("tpuc", 1 - torch.tpuc.current_device())
    x = (torch.arange(4.) + rank).to(other)
    dist.all_reduce(x)
    assert x.device == other and torch.equal(x.cpu(), sum(torch.arange(4.) + r for r in range(world)))
    checked.append("a rank's other device")

    # The functional collectives (what DTensor and compiled programs call) on device tensors.
    import torch.distributed._functional_collectives as funcol

    y = funcol.all_reduce(torch.full((3,), float(rank + 1), device=device), "sum", dist.group.WORLD)
    z = funcol.all_gather_tensor(torch.full((2,), float(rank), device=device), 0, dist.group.WORLD)
    assert y.device.type == "tpuc" and torch.equal(y.cpu(), torch.full((3,), float(sum(range(1, world + 1)))))
    assert torch.equal(z.cpu(), torch.arange(world, dtype=torch.float32).repeat_interleave(2))
    checked.append("functional collectives")

    # ... and inside a graph compiled by tpuc over device tensors (they run in torch between its
    # compiled parts, on the device's backend).
    def reduced(t):
        return funcol.all_reduce(torch.sin(t) * 2, "sum", dist.group.WORLD) + 1

    t = torch.arange(4.0, device=device) + rank
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the compiled graph names the collectives it leaves to torch
        compiled = torch.compile(reduced, backend="tpuc")(t)
    assert compiled.device == device and torch.allclose(compiled.cpu(), reduced(t).cpu())
    checked.append("functional collectives in a graph compiled by tpuc")

    dist.barrier()
    report("collectives", checked=checked)


def _models() -> dict:
    """name: (a fresh model from fixed weights, its batches, its FSDP units, its tensor-parallel
    plan). The zoo's Llama shards its gated MLPs across the ranks (its attention stays whole)."""
    from models import Llama
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    def seeded(make):
        def fresh():
            torch.manual_seed(0)
            return make()
        return fresh

    torch.manual_seed(1)
    mlp_batches = [torch.randn(4, 8) for _ in range(2)]
    token_batches = [torch.randint(0, 64, (2, 16)) for _ in range(2)]
    mlp_plan = {"up": ColwiseParallel(), "down": RowwiseParallel()}
    llama_plan = {f"blocks.{i}.mlp.{name}": style for i in range(2)
                  for name, style in (("gate", ColwiseParallel()), ("up", ColwiseParallel()), ("down", RowwiseParallel()))}
    return {
        "mlp": (seeded(MLP), mlp_batches, lambda m: [m.up, m.down], mlp_plan),
        "llama": (seeded(Llama), token_batches, lambda m: list(m.blocks), llama_plan),
    }


def loss_of(model, x):
    return model(x).float().square().mean()


def full(model) -> list[torch.Tensor]:
    from torch.distributed.tensor import DTensor

    return [(p.full_tensor() if isinstance(p, DTensor) else p).detach().cpu() for p in model.parameters()]


def reference(fresh, batches, parts: int, ranks: int) -> list[torch.Tensor]:
    """The CPU's steps (SGD with momentum) on the first `ranks` of the `parts` parts of each batch
    (the mean of their losses)."""
    model = fresh()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for x in batches:
        part = x.shape[0] // parts
        loss = sum(loss_of(model, x[r * part:(r + 1) * part]) for r in range(ranks)) / ranks
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return [p.detach() for p in model.parameters()]


def training(model_name: str, checkpoints: str | None = None) -> None:
    """Two steps of SGD with momentum of model `model_name` on each rank's half of the batch,
    every way, against the CPU's steps on the whole batch, whose loss is the mean of its halves';
    tensor parallel (every rank sees the same batch) on the first half, against the CPU's steps on
    it, so that every run has the same shapes. The FSDP2 Llama is saved with
    torch.distributed.checkpoint in `checkpoints` and loaded again."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module
    from torch.nn.parallel import DistributedDataParallel

    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("tpuc", torch.tpuc.current_device())
    mesh = init_device_mesh("tpuc", (world,))
    assert mesh.device_type == "tpuc"

    def steps(model, batches, shard_batch: bool) -> list[torch.Tensor]:
        # One tensor at a time: a plan that leaves some parameters plain mixes them with DTensors.
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, foreach=False)
        for x in batches:
            half = x.shape[0] // world
            x = x[rank * half:(rank + 1) * half] if shard_batch else x[:half]
            loss = loss_of(model, x.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return full(model)

    differences = {}
    fresh, batches, units, plan = _models()[model_name]
    expected = {True: reference(fresh, batches, world, world), False: reference(fresh, batches, world, 1)}

    def fsdp(reshard: bool):
        model = fresh().to(device)
        for unit in units(model):
            fully_shard(unit, reshard_after_forward=reshard)
        return fully_shard(model, reshard_after_forward=reshard)

    # (the model, whether each rank trains on its own half of the batch)
    runs = {
        "ddp": lambda: (DistributedDataParallel(fresh().to(device)), True),
        "fsdp2": lambda: (fsdp(True), True),
        "fsdp2 keeping parameters": lambda: (fsdp(False), True),
        "tensor parallel": lambda: (parallelize_module(fresh().to(device), mesh, plan), False),
    }
    for name, make in runs.items():
        model, shard_batch = make()
        got = steps(model, batches, shard_batch)
        differences[f"{model_name} {name}"] = max((g - e).abs().max().item()
                                                  for g, e in zip(got, expected[shard_batch], strict=True))
        if checkpoints is not None and name == "fsdp2":
            dcp.save(model.state_dict(), checkpoint_id=checkpoints)
            restored = fsdp(True)
            state = restored.state_dict()
            dcp.load(state, checkpoint_id=checkpoints)
            restored.load_state_dict(state)
            differences[f"{model_name} fsdp2 checkpoint saved and loaded"] = max(
                (g - e).abs().max().item() for g, e in zip(full(restored), got, strict=True))
    report("training", differences=differences)


def mesh_2d() -> None:
    """Four ranks as a 2 x 2 mesh of the device (`dp`, `tp`): the MLP tensor parallel over `tp`,
    FSDP2 over `dp`, each `dp` rank training on its half of the batch; against the CPU's steps on
    the whole batch."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    device = torch.device("tpuc", torch.tpuc.current_device())
    mesh = init_device_mesh("tpuc", (2, 2), mesh_dim_names=("dp", "tp"))
    fresh, batches, units, plan = _models()["mlp"]
    model = parallelize_module(fresh().to(device), mesh["tp"], plan)
    for unit in units(model):
        fully_shard(unit, mesh=mesh["dp"])
    model = fully_shard(model, mesh=mesh["dp"])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, foreach=False)
    position = mesh["dp"].get_local_rank()
    for x in batches:
        half = x.shape[0] // 2
        loss = loss_of(model, x[position * half:(position + 1) * half].to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    expected = reference(fresh, batches, 2, 2)
    report("mesh_2d", placements=[str(p.placements) for p in model.parameters()],
           difference=max((g - e).abs().max().item() for g, e in zip(full(model), expected, strict=True)))


def mismatch() -> None:
    x = torch.ones(4 + dist.get_rank(), device="tpuc")
    try:
        dist.all_reduce(x)
    except RuntimeError as error:
        report("mismatch", error=str(error))
        return
    report("mismatch", error=None)


def main() -> None:
    torch.tpuc.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(timeout=datetime.timedelta(seconds=60))
    assert dist.get_backend_config() == "tpuc:tpuc", dist.get_backend_config()
    host_group = dist.new_group(backend="gloo")
    for program in sys.argv[1:]:
        if program.startswith("training:"):  # training:MODEL or training:MODEL=CHECKPOINTS
            model_name, _, checkpoints = program.removeprefix("training:").partition("=")
            training(model_name, checkpoints or None)
        else:
            {"collectives": lambda: collectives(host_group), "mismatch": mismatch, "mesh_2d": mesh_2d}[program]()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
