"""torch.distributed programs trained with backend="tpuc" and in eager torch, one process per
rank (run by test_distributed.py under torchrun, gloo on 127.0.0.1): DDP, FSDP2 (fully_shard),
DTensor tensor parallel (parallelize_module) and SimpleFSDP-style parameters (DTensors gathered
for each use, gradients reduce-scattered). Each program trains two steps from the same weights
and data both ways; rank 0 prints one JSON line per program with the largest differences of the
losses and of the parameters after the steps, and how many graphs tpuc compiled."""
import datetime
import json
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(8, 16)
        self.down = nn.Linear(16, 8)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


class Gathered(nn.Module):
    """SimpleFSDP's parametrization: a parameter stored as a DTensor sharded over the mesh,
    gathered whole for each use; its gradient comes back reduce-scattered (a sum over ranks)."""

    def __init__(self, mesh):
        super().__init__()
        self.mesh = mesh

    def forward(self, sharded):
        return sharded.redistribute(self.mesh, [Replicate()]).to_local(grad_placements=[Partial()])


def simple_fsdp(model, mesh):
    for module in list(model.modules()):
        for name, param in list(module.named_parameters(recurse=False)):
            sharded = nn.Parameter(distribute_tensor(param.detach(), mesh, [Shard(0)]))
            module.register_parameter(name, sharded)
            torch.nn.utils.parametrize.register_parametrization(module, name, Gathered(mesh), unsafe=True)
    return model


def wrap(program, model, mesh):
    if program == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    if program == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        fully_shard(model.up, mesh=mesh)
        fully_shard(model.down, mesh=mesh)
        return fully_shard(model, mesh=mesh)
    if program == "tp":
        return parallelize_module(model, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    if program == "simple_fsdp":
        return simple_fsdp(model, mesh)
    raise ValueError(program)


def whole(t):
    return t.full_tensor() if isinstance(t, DTensor) else t


def train(program, backend, mesh, steps=2):
    torch.manual_seed(0)
    model = wrap(program, MLP(), mesh)
    run = torch.compile(model, backend=backend) if backend else model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    rank = dist.get_rank()
    losses = []
    for step in range(steps):
        # Each rank its own batch for data parallelism, the same batch for tensor parallelism.
        seed = step if program == "tp" else 100 * step + rank
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(seed))
        loss = run(x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(whole(loss).item())
    params = [whole(p.detach()).clone() for p in model.parameters()]
    return losses, params


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    from tpuc.runtime import STATS

    for program in sys.argv[1:]:
        eager_losses, eager_params = train(program, None, mesh)
        compiles = STATS["compiles"]
        tpuc_losses, tpuc_params = train(program, "tpuc", mesh)
        loss_diff = max(abs(a - b) for a, b in zip(eager_losses, tpuc_losses))
        param_diff = max((a - b).abs().max().item() for a, b in zip(eager_params, tpuc_params))
        if dist.get_rank() == 0:
            print(json.dumps({"program": program, "loss_diff": loss_diff, "param_diff": param_diff,
                              "losses": tpuc_losses, "compiled": STATS["compiles"] - compiles}), flush=True)
        torch._dynamo.reset()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
