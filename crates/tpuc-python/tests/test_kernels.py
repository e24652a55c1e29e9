"""User kernels in JAX (`tpuc.jax_op`): an elementwise kernel, a Pallas matrix product in interpret
mode and a kernel with its own backward, each on the host, on the tpuc device (strict and fused),
through `torch.compile(backend="tpuc")` (forward and backward, and over a mesh), through
`tpuc.compile_exported` and, with `tpuc.save_kernels`, through `tpuc run` from a directory of
its own; against torch's own formulas. Bad kernels and bad archives are refused by name."""
import json
import os
import subprocess
import sys
import zipfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jax.experimental import pallas as pl

import tpuc

TOL = dict(rtol=1e-5, atol=1e-5)
TPUC_CLI = os.path.join(os.path.dirname(sys.executable), "tpuc")


@tpuc.jax_op("kernels_test::scaled_sin")
def scaled_sin(x, y):
    return jnp.sin(x) * y + 1.0


def _matmul_block(x_ref, y_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], y_ref[...])


def _matmul_backward(x, y, grad):
    """Pallas kernels have no gradient of their own (jax.vjp cannot differentiate them)."""
    return grad @ y.T, x.T @ grad


def _pallas_mm(x, y):
    """A 2 x 2 grid of output blocks, each a row block of x times a column block of y."""
    m, n = x.shape[0], y.shape[1]
    return pl.pallas_call(
        _matmul_block, out_shape=jax.ShapeDtypeStruct((m, n), x.dtype), grid=(2, 2),
        in_specs=[pl.BlockSpec((m // 2, x.shape[1]), lambda i, j: (i, 0)),
                  pl.BlockSpec((y.shape[0], n // 2), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((m // 2, n // 2), lambda i, j: (i, j)), interpret=True)(x, y)


tpuc.jax_op("kernels_test::pallas_mm", _pallas_mm, backward=_matmul_backward)


def _round_backward(x, grad):
    """Straight through: the gradient passes as if rounding were the identity (jax.vjp of round
    would give zeros), so the test tells the two apart."""
    return (grad,)


tpuc.jax_op("kernels_test::round_ste", lambda x: jnp.round(x), backward=_round_backward)
# An integer input: the rows to take (differentiated in its float input only).
tpuc.jax_op("kernels_test::take_rows", lambda x, rows: jnp.take(x, rows, axis=0) * 2)
# Two results, the second input unused (JAX's export drops it from the kernel's signature).
tpuc.jax_op("kernels_test::split_scale", lambda x, unused: (x * 2, x.sum(0)), outputs=2)


def expected_sin(x, y):
    return torch.sin(x) * y + 1


class Block(torch.nn.Module):
    """A layer of each kernel: Pallas's product, then the elementwise kernel, then rounding."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(16, 8) / 4)
        self.b = torch.nn.Parameter(torch.randn(8))

    def forward(self, x):
        h = torch.ops.kernels_test.pallas_mm(x, self.w)
        h = torch.ops.kernels_test.scaled_sin(h, self.b.expand_as(h))
        return torch.ops.kernels_test.round_ste(h * 4) / 4 + h


def reference_block(block, x):
    """The block in torch's own ops (rounding's gradient straight through, as the kernel's)."""
    h = x @ block.w
    h = expected_sin(h, block.b.expand_as(h))
    q = h * 4
    return (q + (torch.round(q) - q).detach()) / 4 + h


def test_the_elementwise_kernel_on_the_host_the_device_and_compiled():
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    want = expected_sin(x, y)
    torch.testing.assert_close(torch.ops.kernels_test.scaled_sin(x, y), want, **TOL)
    on_device = torch.ops.kernels_test.scaled_sin(x.to("tpuc"), y.to("tpuc"))
    assert on_device.device.type == "tpuc"
    torch.testing.assert_close(on_device.cpu(), want, **TOL)
    tpuc.device.fused()
    try:
        fused = torch.ops.kernels_test.scaled_sin(x.to("tpuc") * 2, y.to("tpuc")).relu()
        torch.testing.assert_close(fused.cpu(), expected_sin(2 * x, y).relu(), **TOL)
    finally:
        tpuc.device.fused(False)
    compiled = torch.compile(lambda a, b: torch.ops.kernels_test.scaled_sin(a * 2, b).relu(), backend="tpuc",
                             options={"strict": True})
    torch.testing.assert_close(compiled(x, y), expected_sin(2 * x, y).relu(), **TOL)
    # float64 stays float64 (JAX's 64-bit types are on while kernels are traced and run).
    x64 = x.double()
    assert torch.ops.kernels_test.scaled_sin(x64, y.double()).dtype == torch.float64
    torch.testing.assert_close(compiled(x64, y.double()), expected_sin(2 * x64, y.double()).relu())


def test_gradients_come_from_jax_vjp_or_the_users_backward():
    block = Block()
    x = torch.randn(8, 16)
    compiled = torch.compile(block, backend="tpuc", options={"strict": True})
    got = compiled(x)
    got.square().sum().backward()
    grads = [p.grad.clone() for p in block.parameters()]
    block.zero_grad()
    want = reference_block(block, x)
    want.square().sum().backward()
    torch.testing.assert_close(got, want, **TOL)
    for g, p in zip(grads, block.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-4)
    # On the device, strict eager: the same gradients.
    device_block = Block().to("tpuc")
    device_block.load_state_dict(block.state_dict())
    device_block(x.to("tpuc")).square().sum().backward()
    for g, p in zip(grads, device_block.parameters()):
        torch.testing.assert_close(p.grad.cpu(), g, rtol=1e-4, atol=1e-4)


def test_a_kernel_with_an_integer_input_is_differentiated_in_its_float_one():
    x, rows = torch.randn(5, 3, requires_grad=True), torch.tensor([4, 0, 4])
    compiled = torch.compile(lambda a, r: torch.ops.kernels_test.take_rows(a, r), backend="tpuc",
                             options={"strict": True})
    got = compiled(x, rows)
    torch.testing.assert_close(got, x[rows] * 2)
    got.sum().backward()
    want = torch.zeros(5, 3)
    want[0] += 2
    want[4] += 4
    torch.testing.assert_close(x.grad, want)


def test_a_kernel_with_two_results_and_an_unused_input():
    x, unused = torch.randn(4, 6), torch.randn(3)
    compiled = torch.compile(lambda a, b: torch.ops.kernels_test.split_scale(a, b), backend="tpuc",
                             options={"strict": True})
    doubled, sums = compiled(x, unused)
    torch.testing.assert_close(doubled, x * 2)
    torch.testing.assert_close(sums, x.sum(0), **TOL)


@pytest.mark.parametrize("mesh,plan", [("dp=2", "dp"), ("fsdp=2", "fsdp")])
def test_kernels_under_a_sharding_plan(mesh, plan):
    """XLA partitions the kernel's function with the rest of the program (it is plain
    StableHLO): each device computes its part, results and gradients as on one device."""
    block = Block()
    x = torch.randn(8, 16)
    compiled = torch.compile(block, backend="tpuc", options={"mesh": mesh, "plan": plan})
    got = compiled(x)
    got.sum().backward()
    grads = [p.grad.clone() for p in block.parameters()]
    block.zero_grad()
    want = reference_block(block, x)
    want.sum().backward()
    torch.testing.assert_close(got, want, **TOL)
    for g, p in zip(grads, block.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-4)


def test_exported_programs_through_compile_exported_and_the_cli(tmp_path):
    block = Block().eval()
    x = torch.randn(8, 16)
    with torch.no_grad():
        want = block(x)
    exported = torch.export.export(block, (x,))
    compiled = tpuc.compile_exported(exported)
    torch.testing.assert_close(compiled(x), want, **TOL)
    archive = tmp_path / "block.pt2"
    torch.export.save(exported, archive)
    assert tpuc.save_kernels(exported, archive) == 3
    assert tpuc.save_kernels(exported, archive) == 3  # replaced, not added
    assert sum(n.endswith("extra/tpuc_kernels.json") for n in zipfile.ZipFile(archive).namelist()) == 1
    np.save(tmp_path / "x.npy", x.numpy())
    run = subprocess.run([TPUC_CLI, "run", "block.pt2", "--input", "x.npy", "-o", "out"], cwd=tmp_path,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    torch.testing.assert_close(torch.from_numpy(np.load(tmp_path / "out" / "out0.npy")), want, **TOL)
    ir = subprocess.run([TPUC_CLI, "compile", "block.pt2", "--emit", "ir"], cwd=tmp_path, capture_output=True,
                        text=True)
    assert ir.returncode == 0, ir.stderr
    for op in ("pallas_mm", "scaled_sin", "round_ste"):
        assert f"the kernel of kernels_test.{op}.default" in ir.stdout


def _rewritten(archive, path, change):
    """A copy of `archive` at `path` with its kernels document changed by `change`."""
    with zipfile.ZipFile(archive) as source, zipfile.ZipFile(path, "w") as target:
        for name in source.namelist():
            data = source.read(name)
            if name.endswith("extra/tpuc_kernels.json"):
                document = json.loads(data)
                change(document["kernels"][0])
                data = json.dumps(document)
            target.writestr(name, data)


def test_archives_without_or_with_broken_kernels_are_refused_by_name(tmp_path):
    class Model(torch.nn.Module):
        def forward(self, x):
            return torch.ops.kernels_test.scaled_sin(x, x) * 2

    x = torch.randn(4, 8)
    exported = torch.export.export(Model(), (x,))
    archive = tmp_path / "model.pt2"
    torch.export.save(exported, archive)

    def compile_error(path) -> str:
        result = subprocess.run([TPUC_CLI, "compile", str(path), "-o", str(tmp_path / "out.mlir")],
                                capture_output=True, text=True)
        assert result.returncode == 1, result.stdout
        return result.stderr

    missing = compile_error(archive)
    assert "kernels_test.scaled_sin.default (node scaled_sin)" in missing
    assert "tpuc.save_kernels" in missing
    tpuc.save_kernels(exported, archive)
    _rewritten(archive, tmp_path / "shape.pt2", lambda k: k["outputs"][0].update(shape=[8, 4]))
    shape = compile_error(tmp_path / "shape.pt2")
    assert "its kernel returns a tensor<8x4xf32>" in shape and "fake implementation disagrees" in shape
    _rewritten(archive, tmp_path / "other.pt2", lambda k: k["inputs"][0].update(shape=[2, 8]))
    assert "no kernel of kernels_test.scaled_sin.default takes (tensor<4x8xf32>" in compile_error(
        tmp_path / "other.pt2")
    _rewritten(archive, tmp_path / "cut.pt2", lambda k: k.update(mlir=k["mlir"][:200]))
    assert "the kernel of kernels_test.scaled_sin.default: its module does not parse" in compile_error(
        tmp_path / "cut.pt2")
    _rewritten(archive, tmp_path / "dtype.pt2", lambda k: k["inputs"][0].update(dtype="float128"))
    assert 'unknown dtype "float128"' in compile_error(tmp_path / "dtype.pt2")
    # An archive that is no archive.
    (tmp_path / "junk.pt2").write_bytes(b"junk")
    with pytest.raises(tpuc.TpucError, match="no archive torch.export.save wrote"):
        tpuc.save_kernels(exported, tmp_path / "junk.pt2")


def test_a_pallas_kernel_without_a_backward_says_to_give_one():
    tpuc.jax_op("kernels_test::pallas_mm_no_backward", _pallas_mm)
    x = torch.randn(8, 16, requires_grad=True)
    with pytest.raises(tpuc.TpucError, match="a Pallas kernel has none of its own: give tpuc.jax_op a backward"):
        torch.ops.kernels_test.pallas_mm_no_backward(x, torch.randn(16, 8)).sum().backward()


def test_bad_registrations_are_refused_by_name():
    with pytest.raises(tpuc.TpucError, match="not 'namespace::name'"):
        tpuc.jax_op("no_namespace", lambda x: x)
    with pytest.raises(tpuc.TpucError, match="namespace 'aten' is taken"):
        tpuc.jax_op("aten::mine", lambda x: x)
    with pytest.raises(tpuc.TpucError, match="positional and without a default"):
        tpuc.jax_op("kernels_test::scaled", lambda x, scale=2.0: x * scale)
    with pytest.raises(tpuc.TpucError, match="registered already"):
        tpuc.jax_op("kernels_test::scaled_sin", lambda x, y: x)
    # Returning another number of arrays than registered is said when the op is first traced.
    tpuc.jax_op("kernels_test::pair", lambda x: (x, x))
    with pytest.raises(tpuc.TpucError, match="returns 2 arrays; it was registered with outputs=1"):
        torch.ops.kernels_test.pair(torch.randn(3))



def test_dynamic_sizes_compile_a_kernel_per_size():
    """The backend compiles a graph with symbolic sizes for the sizes it is called with, each with
    its kernel (JAX's shape evaluation needs numbers, so the sizes a kernel reads are
    specialized); an export that keeps them dynamic is refused by torch for that reason."""
    compiled = torch.compile(lambda x: torch.ops.kernels_test.scaled_sin(x, x), backend="tpuc", dynamic=True,
                             options={"strict": True})
    for rows in (5, 7):
        x = torch.randn(rows, 3)
        torch.testing.assert_close(compiled(x), expected_sin(x, x), **TOL)

    class Model(torch.nn.Module):
        def forward(self, x):
            return torch.ops.kernels_test.scaled_sin(x, x)

    with pytest.raises(torch._dynamo.exc.UserError, match="specialized it to be a constant"):
        torch.export.export(Model(), (torch.randn(5, 3),), dynamic_shapes=({0: torch.export.Dim("rows", min=2)},))


def test_without_jax_jax_op_says_what_to_install():
    code = ("import sys; sys.modules['jax'] = None\n"
            "import tpuc\n"
            "try:\n"
            "    tpuc.jax_op('mylib::f', lambda x: x)\n"
            "except tpuc.TpucError as error:\n"
            "    print(error)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "pip install 'tpuc[jax]'" in result.stdout
