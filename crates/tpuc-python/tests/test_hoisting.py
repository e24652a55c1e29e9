"""Values derived from weights alone (convolution kernels relaid out for the plugin, batch norm
scales) computed once per weight version in inference, and recomputed when a weight changes."""
import gc

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from tpuc.runtime import STATS, session


class ConvBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.BatchNorm2d(8)
        self.head = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        return self.head(F.relu(self.norm(self.conv(x))))


def trained_block() -> ConvBlock:
    """A block whose batch norm statistics are not the initial ones."""
    model = ConvBlock()
    with torch.no_grad():
        model.norm.running_mean.uniform_(-1, 1)
        model.norm.running_var.uniform_(0.5, 2)
        model.norm.weight.uniform_(0.5, 1.5)
    return model.eval()


def close(a, b, tol=1e-5):
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def test_weight_values_are_computed_once_per_version(tmp_path):
    model = trained_block()
    compiled = torch.compile(model, backend="tpuc", options={"dump_dir": str(tmp_path), "strict": True})
    x = torch.randn(2, 3, 10, 10)
    with torch.no_grad():
        close(compiled(x), model(x))
        prepared = STATS["prepared"]
        for _ in range(3):
            y = torch.randn(2, 3, 10, 10)
            close(compiled(y), model(y))
        assert STATS["prepared"] == prepared  # the same weights: nothing recomputed

        # Each kind of weight change is seen: a kernel and a batch norm statistic are recomputed
        # from; a bias, read as it is, is not.
        for change, recomputed in (
            (lambda: model.conv.weight.mul_(0.5), 1),
            (lambda: model.norm.running_var.add_(1.0), 1),
            (lambda: model.head.bias.sub_(0.25), 0),
        ):
            change()
            close(compiled(x), model(x))
            assert STATS["prepared"] == prepared + recomputed
            prepared += recomputed

    (main,) = tmp_path.glob("*_inference.mlir")
    (prep,) = tmp_path.glob("*_inference.prepared.mlir")
    # Both kernels are read in XLA:CPU's layout, transposed once in the prepared module.
    assert main.read_text().count("x[0, 1, i, o]->") == 2
    assert prep.read_text().count("stablehlo.transpose") == 2
    # The batch norm's scale 1 / sqrt(var + eps) is computed from weights only: prepared.
    assert "stablehlo.sqrt" in prep.read_text() and "stablehlo.sqrt" not in main.read_text()


def test_each_set_of_weights_keeps_its_values_while_it_lives():
    # Two blocks of one class share a compiled graph (the weights are its inputs), as when each
    # layer of a model is compiled on its own.
    blocks = [trained_block(), trained_block()]
    compiled = [torch.compile(b, backend="tpuc") for b in blocks]
    x = torch.randn(1, 3, 8, 8)
    before = STATS["prepared"]
    runtime = session(None).runtime
    sets = runtime.prepared_sets
    with torch.no_grad():
        for _ in range(3):
            for block, f in zip(blocks, compiled):
                close(f(x), block(x))
    assert STATS["prepared"] - before == 2  # once per block, however they alternate
    assert runtime.prepared_sets - sets == 2
    # A block that goes takes its values with it.
    del blocks[1], compiled[1], block, f
    gc.collect()
    assert runtime.prepared_sets - sets == 1


def test_graphs_specialised_per_size_share_the_values():
    model = trained_block()
    compiled = torch.compile(model, backend="tpuc", dynamic=True)
    before = dict(STATS)
    with torch.no_grad():
        for size in (8, 10, 12, 10):
            x = torch.randn(1, 3, size, size)
            close(compiled(x), model(x))
    assert STATS["compiles"] - before["compiles"] == 3  # one graph per size
    assert STATS["prepared"] - before["prepared"] == 1  # one copy of the values


def test_hoisting_can_be_turned_off(tmp_path):
    model = trained_block()
    compiled = torch.compile(model, backend="tpuc", options={"dump_dir": str(tmp_path), "hoist_weights": False})
    x = torch.randn(1, 3, 8, 8)
    prepared = STATS["prepared"]
    with torch.no_grad():
        close(compiled(x), model(x))
    assert STATS["prepared"] == prepared
    assert not list(tmp_path.glob("*.prepared.mlir"))
    assert "x[o, i, 0, 1]->" in next(tmp_path.glob("*_inference.mlir")).read_text()


def test_inputs_that_change_are_not_hoisted(tmp_path):
    # The kernel is an argument of the compiled function, not a weight of a module.
    f = torch.compile(lambda x, w: F.conv2d(x, w).relu(), backend="tpuc", options={"dump_dir": str(tmp_path)})
    with torch.no_grad():
        for _ in range(2):
            x, w = torch.randn(1, 2, 6, 6), torch.randn(3, 2, 3, 3)
            close(f(x, w), F.conv2d(x, w).relu())
    assert not list(tmp_path.glob("*.prepared.mlir"))


def test_training_recomputes_the_values_after_each_step(tmp_path):
    torch.manual_seed(0)
    model = trained_block().train()
    reference = trained_block().train()
    reference.load_state_dict(model.state_dict())
    compiled = torch.compile(model, backend="tpuc", options={"dump_dir": str(tmp_path)})
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    x = torch.randn(2, 3, 8, 8)
    before = STATS["prepared"]
    for _ in range(3):
        loss = compiled(x).square().mean()
        expected = reference(x).square().mean()
        close(loss, expected, tol=1e-4)
        for opt, value in ((optimizer, loss), (reference_optimizer, expected)):
            opt.zero_grad()
            value.backward()
            opt.step()
    for p, q in zip(model.parameters(), reference.parameters()):
        close(p, q, tol=1e-4)
    assert STATS["prepared"] - before == 3  # the kernels changed at every step
    assert list(tmp_path.glob("*_forward.prepared.mlir"))
    assert not list(tmp_path.glob("*_backward.prepared.mlir"))


def test_eval_without_no_grad_is_hoisted_too(tmp_path):
    # Gradients enabled: aot_autograd compiles a forward graph for training.
    model = trained_block()
    compiled = torch.compile(model, backend="tpuc", options={"dump_dir": str(tmp_path)})
    x = torch.randn(1, 3, 8, 8)
    before = STATS["prepared"]
    for _ in range(3):
        close(compiled(x), model(x))
    assert STATS["prepared"] - before == 1
    assert list(tmp_path.glob("*_forward.prepared.mlir"))


@pytest.mark.parametrize(
    "layer, shape",
    [
        (nn.Conv1d(4, 6, 3, stride=2, padding=1), (2, 4, 11)),
        (nn.Conv2d(4, 6, 3, groups=2, dilation=2, padding=2), (2, 4, 9, 9)),
        (nn.Conv3d(2, 3, (2, 3, 3), padding=(0, 1, 1)), (1, 2, 4, 6, 6)),
        (nn.ConvTranspose2d(4, 3, 3, stride=2, padding=1, output_padding=1), (1, 4, 5, 5)),
        (nn.ConvTranspose1d(4, 6, 4, stride=3, groups=2), (2, 4, 7)),
    ],
    ids=["conv1d", "conv2d_grouped_dilated", "conv3d", "conv_transpose2d", "conv_transpose1d_grouped"],
)
def test_relaid_out_kernels_of_every_convolution_kind_match_eager(tmp_path, layer, shape):
    layer = layer.eval()
    compiled = torch.compile(layer, backend="tpuc", options={"dump_dir": str(tmp_path), "strict": True})
    x = torch.randn(*shape)
    with torch.no_grad():
        close(compiled(x), layer(x))
    assert list(tmp_path.glob("*.prepared.mlir"))
