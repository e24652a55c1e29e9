"""One rank's program of a torch.distributed computation, traced in this process under a fake
process group of N ranks, run by tpuc.spmd as one SPMD program over N CPU devices (device d as
rank d, fed rank d's shard), against the unsharded computation in eager torch: a
tensor-parallel MLP (DTensor, forward and backward), a SimpleFSDP training step, a 2-D mesh
(tensor parallel within rows, gradients averaged over columns), each functional collective,
and what cannot run refused by name."""
import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.testing._internal.distributed.fake_pg import FakeStore

import tpuc
from tpuc import _tpuc

TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture
def fake_world():
    """A fake process group of `n` ranks, this process rank 0: torch.distributed code traces as
    rank 0 would run it (its collectives do nothing here)."""
    def start(n, mesh_shape=None, names=None):
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=n)
        return init_device_mesh("cpu", mesh_shape or (n,), mesh_dim_names=names)

    yield start
    if dist.is_initialized():
        dist.destroy_process_group()


def mlp_weights(hidden=16):
    torch.manual_seed(0)
    return torch.randn(hidden, 8), torch.randn(8, hidden) / 4


def mlp_loss(w1, w2, x):
    return (torch.relu(x @ w1.t()) @ w2.t()).square().mean()


def grads(loss_fn, *weights):
    weights = [w.detach().clone().requires_grad_() for w in weights]
    loss = loss_fn(*weights)
    return loss.detach(), torch.autograd.grad(loss, weights)


def local(t):
    return t.detach().contiguous().clone().requires_grad_()


@pytest.mark.parametrize("n", [2, 4])
def test_tensor_parallel_mlp_matches_the_unsharded_one(fake_world, n):
    mesh = fake_world(n)

    def step(w1, w2, x):
        # Megatron's MLP: the first weight split by rows (column parallel), the second by
        # columns (row parallel); one all-reduce in the forward pass.
        w1 = DTensor.from_local(w1, mesh, [Shard(0)])
        w2 = DTensor.from_local(w2, mesh, [Shard(1)])
        x = DTensor.from_local(x, mesh, [Replicate()])
        y = (torch.relu(x @ w1.t()) @ w2.t()).redistribute(mesh, [Replicate()])
        loss = y.to_local().square().mean()
        g1, g2 = torch.autograd.grad(loss, [w1, w2])
        # DTensor results come back as each rank's local part, as to_local gives it.
        return (loss, g1, g2) if n == 2 else (loss, g1.to_local(), g2.to_local())

    w1, w2 = mlp_weights()
    x = torch.randn(4, 8)
    loss, (g1, g2) = grads(lambda a, b: mlp_loss(a, b, x), w1, w2)
    program = tpuc.spmd(step, mesh)
    ranks = [[local(w1.chunk(n, 0)[r]), local(w2.chunk(n, 1)[r]), x] for r in range(n)]
    results = program(ranks)
    for rank_loss, _, _ in results:
        torch.testing.assert_close(rank_loss, loss, **TOL)
    torch.testing.assert_close(torch.cat([r[1] for r in results], 0), g1, **TOL)
    torch.testing.assert_close(torch.cat([r[2] for r in results], 1), g2, **TOL)
    # The executable holds the collectives tpuc lowered, inside a manual computation.
    module = program.compiled_graphs()[0].stablehlo
    assert "sdy.manual_computation" in module and "stablehlo.all_reduce" in module


@pytest.mark.parametrize("n", [2, 4])
def test_a_simple_fsdp_step_matches_the_unsharded_one(fake_world, n):
    mesh = fake_world(n)
    lr = 0.1

    def gathered(shard):
        # SimpleFSDP: each rank stores a shard, gathers the whole for the forward pass; the
        # gradient comes back reduce-scattered (a sum over ranks).
        whole = DTensor.from_local(shard, mesh, [Shard(0)]).redistribute(mesh, [Replicate()])
        return whole.to_local(grad_placements=[Partial()])

    def step(w1, w2, x):
        loss = mlp_loss(gathered(w1), gathered(w2), x)
        g1, g2 = torch.autograd.grad(loss, [w1, w2])
        return loss, w1 - lr * g1, w2 - lr * g2

    w1, w2 = mlp_weights()
    batches = torch.randn(4 * n, 8).chunk(n)
    losses, sums = [], [0, 0]
    for x in batches:
        loss, gs = grads(lambda a, b, x=x: mlp_loss(a, b, x), w1, w2)
        losses.append(loss)
        sums = [s + g for s, g in zip(sums, gs)]
    program = tpuc.spmd(step, mesh)
    results = program([[local(w1.chunk(n)[r]), local(w2.chunk(n)[r]), batches[r]] for r in range(n)])
    for (rank_loss, _, _), loss in zip(results, losses):
        torch.testing.assert_close(rank_loss, loss, **TOL)
    torch.testing.assert_close(torch.cat([r[1] for r in results]), w1 - lr * sums[0], **TOL)
    torch.testing.assert_close(torch.cat([r[2] for r in results]), w2 - lr * sums[1], **TOL)
    module = program.compiled_graphs()[0].stablehlo
    assert "stablehlo.all_gather" in module and "stablehlo.reduce_scatter" in module


def test_a_two_dimensional_mesh_groups_ranks_by_dimension(fake_world):
    mesh = fake_world(4, (2, 2), ("dp", "tp"))
    groups = tpuc.process_groups(mesh)
    assert sorted(groups.values()) == sorted([[[0, 1, 2, 3]], [[0, 1], [2, 3]], [[0, 2], [1, 3]]])

    def step(w1, w2, x):
        # Tensor parallel along tp, each dp row its own batch; gradients averaged over dp.
        w1 = DTensor.from_local(w1, mesh, [Replicate(), Shard(0)])
        w2 = DTensor.from_local(w2, mesh, [Replicate(), Shard(1)])
        x = DTensor.from_local(x, mesh, [Shard(0), Replicate()])
        y = (torch.relu(x @ w1.t()) @ w2.t()).redistribute(mesh, [Shard(0), Replicate()])
        loss = y.to_local().square().mean()
        g1, g2 = torch.autograd.grad(loss, [w1, w2])
        return [loss] + [funcol.all_reduce(g.to_local(), "avg", (mesh, 0)) for g in (g1, g2)]

    w1, w2 = mlp_weights()
    batches = torch.randn(8, 8).chunk(2)
    expected = [grads(lambda a, b, x=x: mlp_loss(a, b, x), w1, w2) for x in batches]
    mean = [sum(e[1][i] for e in expected) / 2 for i in range(2)]
    ranks = []
    for r in range(4):
        row, col = divmod(r, 2)
        ranks.append([local(w1.chunk(2, 0)[col]), local(w2.chunk(2, 1)[col]), batches[row]])
    results = tpuc.spmd(step, mesh)(ranks)
    for r, (loss, g1, g2) in enumerate(results):
        row, col = divmod(r, 2)
        torch.testing.assert_close(loss, expected[row][0], **TOL)
        torch.testing.assert_close(g1, mean[0].chunk(2, 0)[col], **TOL)
        torch.testing.assert_close(g2, mean[1].chunk(2, 1)[col], **TOL)


def test_each_functional_collective_computes_what_torch_says(fake_world):
    n = 4
    fake_world(n)
    world = dist.group.WORLD

    def step(x, y):
        return {
            "sum": funcol.all_reduce(x, "sum", world),
            "avg": funcol.all_reduce(x, "avg", world),
            "max": funcol.all_reduce(x, "max", world),
            "min": funcol.all_reduce(x, "min", world),
            "product": funcol.all_reduce(x, "product", world),
            "gather": funcol.all_gather_single(x, 0, world),
            "gather1": funcol.all_gather_single(x, 1, world),
            "scatter": funcol.reduce_scatter_single(y, "sum", 0, world),
            "exchange": funcol.all_to_all_single(y, None, None, world),
            "broadcast": funcol.broadcast(x, 2, world),
            "coalesced": funcol.all_reduce_coalesced([x, y], "sum", world),
        }

    torch.manual_seed(1)
    xs = [torch.rand(2, 3) + 0.5 for _ in range(n)]
    ys = [torch.randn(8, 3) for _ in range(n)]
    results = tpuc.spmd(step, world_size=n, groups={world.group_name: [list(range(n))]})(
        [[x, y] for x, y in zip(xs, ys)])
    stacked = torch.stack(xs)
    for r, got in enumerate(results):
        torch.testing.assert_close(got["sum"], stacked.sum(0), **TOL)
        torch.testing.assert_close(got["avg"], stacked.mean(0), **TOL)
        torch.testing.assert_close(got["max"], stacked.amax(0), **TOL)
        torch.testing.assert_close(got["min"], stacked.amin(0), **TOL)
        torch.testing.assert_close(got["product"], stacked.prod(0), **TOL)
        torch.testing.assert_close(got["gather"], torch.cat(xs, 0), **TOL)
        torch.testing.assert_close(got["gather1"], torch.cat(xs, 1), **TOL)
        torch.testing.assert_close(got["scatter"], sum(ys).chunk(n)[r], **TOL)
        torch.testing.assert_close(got["exchange"], torch.cat([y.chunk(n)[r] for y in ys]), **TOL)
        torch.testing.assert_close(got["broadcast"], xs[2], **TOL)
        torch.testing.assert_close(got["coalesced"][0], stacked.sum(0), **TOL)
        torch.testing.assert_close(got["coalesced"][1], sum(ys), **TOL)


def test_what_cannot_run_is_refused_by_name(fake_world):
    n = 2
    mesh = fake_world(n)
    world = dist.group.WORLD
    groups = {world.group_name: [[0, 1]]}
    x = torch.randn(4, 2)

    def uneven(t):
        return funcol.all_to_all_single(t, [1, 3], [3, 1], world)

    with pytest.raises(_tpuc.TpucError, match="even splits only"):
        tpuc.spmd(uneven, world_size=n, groups=groups)([[x], [x]])

    program = tpuc.spmd(lambda t: funcol.all_reduce(t, "sum", world), world_size=n, groups=groups)
    with pytest.raises(ValueError, match="the arguments of 2 ranks, got 1"):
        program([[x]])
    with pytest.raises(ValueError, match="argument 0 of rank 1 is a float32 tensor of shape \\[3, 2\\]"):
        program([[x], [torch.randn(3, 2)]])
    with pytest.raises(ValueError, match="do not hold each of the 2 ranks once"):
        tpuc.spmd(uneven, world_size=n, groups={"0": [[0]]})
    with pytest.raises(_tpuc.TpucError, match="process group .* is not one the program was given"):
        tpuc.spmd(lambda t: funcol.all_reduce(t, "sum", world), world_size=n, groups={"other": [[0, 1]]})(
            [[x], [x]])
    with pytest.raises(ValueError, match="argument 0 of rank 1 is a DTensor: pass each rank's own local"):
        program([[x], [DTensor.from_local(x, mesh, [Replicate()])]])
    with pytest.raises(_tpuc.TpucError, match="is of type int, not a tensor"):
        tpuc.spmd(lambda t: (t * 2, 3), world_size=n, groups=groups)([[x], [x]])
    with pytest.raises(ValueError, match="needs a DeviceMesh, or world_size and groups"):
        tpuc.spmd(uneven)


def test_an_ordinary_graph_leaves_collectives_to_torch():
    # torch.compile under torchrun: the graph's collectives run in torch (test_distributed.py).
    assert not _tpuc.is_supported("_c10d_functional.all_reduce.default")
    assert "_c10d_functional.all_reduce.default" not in tpuc.supported_ops()
