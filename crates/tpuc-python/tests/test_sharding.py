"""torch.compile(backend="tpuc") over device meshes: the zoo's inference and a training step
under each plan against eager, layouts marked by hand (tpuc.Mesh, mark_sharding, shard) and
seen in the compiled module, and what does not fit refused by name."""
import copy
import json
import os
import subprocess
import sys

import pytest
import torch
from models import zoo

import tpuc

MODELS = {name: (model, inputs) for name, model, inputs in zoo()}
TOL = dict(rtol=1e-5, atol=1e-5)

INFERENCE = [
    ("llama", "dp=2", "dp"),
    ("llama", "fsdp=2,tp=2", "fsdp,tp"),
    ("qwen", "tp=2", "tp"),
    ("qwen", "fsdp=2", "fsdp"),
    ("mingpt", "fsdp=2,tp=2", "fsdp,tp"),
    # Convolution kernels relaid out once (hoisted), on every device, from sharded weights.
    ("resnet18", "fsdp=2", "fsdp"),
]


@pytest.mark.parametrize("name,mesh,plan", INFERENCE, ids=[f"{n}-{m}" for n, m, _ in INFERENCE])
def test_inference_over_a_mesh_matches_eager(name, mesh, plan):
    model, inputs = MODELS[name]
    compiled = torch.compile(model, backend="tpuc", options={"mesh": mesh, "plan": plan, "strict": True})
    with torch.no_grad():
        torch.testing.assert_close(compiled(*inputs), model(*inputs), **TOL)


def train_step(model, run, inputs):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loss = run(*inputs).square().mean()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    optimizer.step()
    return loss.detach(), grads, {n: p.detach().clone() for n, p in model.named_parameters()}


def signal(grad):
    """The elements whose gradient carries signal: Adam scales every gradient to a step of about
    lr, so one that is rounding noise (a key bias, which softmax ignores) takes a full-sized step
    of noise in either run."""
    return grad.abs() > 1e-6


PLANS = [("dp=2", "dp"), ("fsdp=2", "fsdp"), ("tp=2", "tp"), ("fsdp=2,tp=2", "fsdp,tp")]
TRAINING = [(name, mesh, plan) for name in ("llama", "qwen", "mingpt") for mesh, plan in PLANS]


@pytest.mark.parametrize("name,mesh,plan", TRAINING, ids=[f"{n}-{m}" for n, m, _ in TRAINING])
def test_a_training_step_over_a_mesh_matches_eager(name, mesh, plan):
    """Loss, every gradient, and the parameters after an AdamW step. Gradients agree to ~1e-8;
    AdamW divides each by the root of its square, so parameters move by up to ~3e-5 differently
    (on one device too: ~2e-5), and those whose gradient is noise by a whole step."""
    base, inputs = MODELS[name]
    eager_model = copy.deepcopy(base).train()
    loss_e, grads_e, params_e = train_step(eager_model, eager_model, inputs)
    model = copy.deepcopy(base).train()
    compiled = torch.compile(model, backend="tpuc", options={"mesh": mesh, "plan": plan, "strict": True})
    loss, grads, params = train_step(model, compiled, inputs)
    torch.testing.assert_close(loss, loss_e, **TOL)
    for n in grads_e:
        torch.testing.assert_close(grads[n], grads_e[n], **TOL, msg=lambda m, n=n: f"gradient of {n}: {m}")
        keep = signal(grads_e[n])
        torch.testing.assert_close(params[n][keep], params_e[n][keep], rtol=1e-4, atol=1e-4,
                                   msg=lambda m, n=n: f"{n}: {m}")


# Collectives in XLA's optimized programs of a Llama training step (forward, backward), by plan.
# dp: nothing in the forward (activations stay split by batch, also those saved for the backward),
# the gradients' all-reduce (one, combined) in the backward. fsdp: each of the 21 parameters
# gathered in the forward; the backward reduces the gradients (on the CPU plugin an all-reduce and
# a slice where a TPU forms a reduce-scatter, see facts). tp: two all-reduces per layer and one for
# the vocabulary-split embedding, in each direction, the forward gathering what it saves.
EXPECTED_COLLECTIVES = {
    ("dp=2", "dp"): [{}, {"all-reduce": 1}],
    # Each of the 21 weights gathered at use in the forward, and again in the backward where the
    # backward uses it (all but the embedding); the gradients reduced in one combined all-reduce.
    ("fsdp=2", "fsdp"): [{"all-gather": 21}, {"all-reduce": 1, "all-gather": 20}],
    # What the forward saves stays split as XLA computed it (nothing gathered); the backward's
    # attention gathers heads where its batched products merge batch and heads (16).
    ("tp=2", "tp"): [{"all-reduce": 5}, {"all-reduce": 5, "all-gather": 16}],
    # No all-to-all or collective-permute: the embedding's batch-split ids meet its table gathered
    # over fsdp (vocabulary still split over tp), never a resharded table.
    ("fsdp=2,tp=2", "fsdp,tp"): [{"all-reduce": 5, "all-gather": 42}, {"all-reduce": 6, "all-gather": 28}],
}


@pytest.mark.parametrize("mesh,plan", list(EXPECTED_COLLECTIVES), ids=[m for m, _ in EXPECTED_COLLECTIVES])
def test_a_training_step_holds_the_collectives_its_plan_implies(mesh, plan):
    here = os.path.dirname(os.path.abspath(__file__))
    run = subprocess.run([sys.executable, os.path.join(here, "training_collectives.py"), mesh, plan],
                         capture_output=True, text=True, timeout=300, cwd=here,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert run.returncode == 0, run.stderr[-4000:]
    counts = json.loads(run.stdout.splitlines()[-1])
    expected = [{kind: want.get(kind, 0) for kind in counts[0]} for want in EXPECTED_COLLECTIVES[(mesh, plan)]]
    assert counts == expected


def results_of_main(path) -> str:
    """The result types and shardings of a dumped module's main function."""
    (signature,) = [line for line in path.read_text().splitlines() if "func.func @main(" in line]
    return signature.split(") -> (", 1)[1]


def test_gradients_and_optimizer_state_stay_split_like_their_parameters(tmp_path):
    """Under fsdp, the backward returns each gradient split as its parameter is (no gather), and
    a compiled AdamW step takes and returns the parameters and their state split alike; three
    steps match eager."""
    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
    model = copy.deepcopy(eager)
    options = {"mesh": "fsdp=2", "plan": "fsdp", "strict": True, "dump_dir": str(tmp_path)}
    compiled = torch.compile(model, backend="tpuc", options=options)
    x = torch.randn(4, 8)
    eager_optimizer = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    @torch.compile(backend="tpuc", options=options)
    def step():
        optimizer.step()

    for _ in range(3):
        eager(x).square().mean().backward()
        grads_e = [p.grad.clone() for p in eager.parameters()]
        eager_optimizer.step()
        eager_optimizer.zero_grad()
        compiled(x).square().mean().backward()
        for p, g in zip(model.parameters(), grads_e):
            torch.testing.assert_close(p.grad, g, **TOL)
        step()
        optimizer.zero_grad()
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p, q, **TOL)
        for key, value in optimizer.state[p].items():
            torch.testing.assert_close(value, eager_optimizer.state[q][key], **TOL)
    (backward,) = tmp_path.glob("*_backward.mlir")
    grads = results_of_main(backward)
    assert grads.count('[{"fsdp"}, {}]') == 2 and grads.count('[{"fsdp"}]') == 2, grads
    (update,) = tmp_path.glob("*_inference.mlir")
    # The step updates its parameters: nothing is derived from them once to keep (hoisted).
    assert not list(tmp_path.glob("*_inference.prepared.mlir"))
    # Four parameters and their two moments each, split; the step counts whole.
    updated = results_of_main(update)
    assert updated.count('{"fsdp"}') == 12 and updated.count("<@mesh, []>") == 4, updated


class ParallelMLP(torch.nn.Module):
    """Megatron's MLP for the plan tp: `up` column-parallel, `down` row-parallel."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(8, 16)
        self.down = torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def step_matches_eager(eager: torch.nn.Module, model: torch.nn.Module, options: dict) -> None:
    """One forward and backward of `model` (a copy of `eager`) compiled with `options` (strict,
    no on-disk cache) gives eager's gradients."""
    compiled = torch.compile(model, backend="tpuc", options={"strict": True, "cache_dir": "off", **options})
    x = torch.randn(4, 8)
    compiled(x).square().mean().backward()
    eager(x).square().mean().backward()
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **TOL)


def args_of_main(path) -> str:
    """The argument types and shardings of a dumped module's main function."""
    (signature,) = [line for line in path.read_text().splitlines() if "func.func @main(" in line]
    return signature.split(") -> (", 1)[0]


def test_weights_split_by_fsdp_are_gathered_at_use_and_kept_split_for_the_backward(tmp_path):
    """A model laid out by `shard(model, mesh, "fsdp")` alone (no plan option): each weight is
    constrained to its gathered layout where the forward uses it; the backward receives the
    weights as they are stored (split) and gathers them again, rather than the forward handing
    it whole copies; gradients match eager."""
    torch.manual_seed(0)
    eager = ParallelMLP()
    step_matches_eager(eager, tpuc.shard(copy.deepcopy(eager), "fsdp=2", "fsdp"),
                       {"mesh": "fsdp=2", "dump_dir": str(tmp_path)})
    (forward,) = tmp_path.glob("*_forward.fx.txt")
    assert forward.read_text().count("tpuc.sharding_constraint.default(primals") == 4
    (backward,) = tmp_path.glob("*_backward.mlir")
    # The one weight the backward needs (the second layer's, for the hidden activation's
    # gradient) arrives split, as stored; nothing else is split.
    args = args_of_main(backward)
    assert args.count('tensor<8x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"fsdp"}, {}]>}') == 1, args
    assert args.count('"fsdp"') == 1, args


def test_what_a_forward_saves_stays_laid_out_as_xla_computed_it(tmp_path):
    """Under tp the forward leaves the layouts of the values it saves to XLA's partitioner (no
    sharding on those results), reads back the one it chose (the hidden activation split over
    tp, as the column-parallel layer computes it), and the backward takes it so: nothing is
    gathered to be handed over; gradients match eager."""
    torch.manual_seed(0)
    eager = ParallelMLP()
    step_matches_eager(eager, copy.deepcopy(eager), {"mesh": "tp=2", "plan": "tp", "dump_dir": str(tmp_path)})
    (forward,) = tmp_path.glob("*_forward.mlir")
    results = results_of_main(forward)
    # The output and the values computed for the backward are left to the partitioner; the
    # input it saves as it is keeps its own layout (whole under tp).
    assert results.count("sdy.sharding = ") == 1, results
    assert "tensor<4x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}]>}" in results, results
    (ir,) = tmp_path.glob("*_forward.ir.txt")
    returned = next(line for line in ir.read_text().splitlines() if line.strip().startswith("return"))
    assert "sharding [{}, {tp}]" in returned, returned
    (backward,) = tmp_path.glob("*_backward.mlir")
    args = args_of_main(backward)
    assert 'tensor<4x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"tp"}]>}' in args, args


def test_marked_layouts_reach_the_compiled_module(tmp_path):
    model, inputs = copy.deepcopy(MODELS["llama"][0]), MODELS["llama"][1]
    mesh = tpuc.Mesh((2, 2), ("fsdp", "tp"))
    tpuc.shard(model, mesh, "tp")
    assert model.blocks[0].attn.q.weight._tpuc_sharding == ("fsdp=2,tp=2", [["tp"], []], None)
    # Under fsdp a weight is stored split over fsdp and used gathered over it.
    tpuc.shard(model, mesh, "fsdp,tp")
    assert model.blocks[0].attn.q.weight._tpuc_sharding == ("fsdp=2,tp=2", [["tp"], ["fsdp"]], [["tp"], []])
    # A rule by pattern before the ready plan, and an input marked by hand.
    tpuc.shard(model, mesh, {"rules": {"*.attn_norm.weight": ["fsdp"]}, "ready": "tp"})
    tokens = tpuc.mark_sharding(inputs[0].clone(), mesh, ("fsdp", None))
    compiled = torch.compile(model, backend="tpuc", options={"mesh": mesh, "dump_dir": str(tmp_path)})
    with torch.no_grad():
        torch.testing.assert_close(compiled(tokens), model(inputs[0]), **TOL)
    (text,) = [p.read_text() for p in tmp_path.glob("*.mlir") if not p.name.endswith("prepared.mlir")]
    assert 'sdy.mesh = #sdy.mesh<["fsdp"=2, "tp"=2]>' in text or '#sdy.mesh<["fsdp"=2, "tp"=2]>' in text
    for layout in ('[{"tp"}, {}]', '[{"fsdp"}]', '[{"fsdp"}, {}]', '[{}, {"tp"}]'):
        assert f"#sdy.sharding<@mesh, {layout}>" in text, layout


class Constrained(ParallelMLP):
    """The MLP with its hidden activation laid out over (dp, tp) by the model itself."""

    def forward(self, x):
        hidden = tpuc.sharding_constraint(torch.relu(self.up(x)), "dp=2,tp=2", ("dp", "tp"))
        return self.down(hidden)


def test_a_constraint_inside_a_model_lays_out_the_value_and_its_gradient(tmp_path):
    torch.manual_seed(0)
    model, x = Constrained(), torch.randn(4, 8)
    eager = copy.deepcopy(model)
    eager(x).square().sum().backward()
    # Eager and on one device it is the value itself.
    torch.testing.assert_close(torch.compile(copy.deepcopy(model), backend="tpuc")(x), eager(x), **TOL)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="tpuc",
                             options={"mesh": "dp=2,tp=2", "plan": "dp", "strict": True, "dump_dir": str(tmp_path)})
    compiled(x).square().sum().backward()
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **TOL)
    layout = '"sdy.sharding_constraint"'
    dumps = {p.name: p.read_text() for p in tmp_path.glob("*.mlir")}
    forward = [t for n, t in dumps.items() if "forward" in n]
    backward = [t for n, t in dumps.items() if "backward" in n]
    assert forward and all(layout in t and '[{"dp"}, {"tp"}]' in t for t in forward), dumps.keys()
    assert backward and all(layout in t for t in backward), dumps.keys()


def test_an_exported_constraint_runs_through_tpuc_run(tmp_path):
    """torch.export keeps the custom op; `tpuc run` places the value over the mesh, and on one
    device the constraint changes nothing."""
    import os
    import subprocess

    import numpy as np
    from test_zoo import tpuc_binary

    torch.manual_seed(0)
    model, x = Constrained(), torch.randn(4, 8)
    archive = tmp_path / "constrained.pt2"
    torch.export.save(torch.export.export(model, (x,)), str(archive))
    np.savez(tmp_path / "inputs.npz", x.numpy())
    np.savez(tmp_path / "expected.npz", model(x).detach().numpy())
    for layout in ([], ["--mesh", "dp=2,tp=2", "--plan", "dp"]):
        run = subprocess.run(
            [tpuc_binary(), "run", str(archive), *layout, "--input", str(tmp_path / "inputs.npz"),
             "--out", str(tmp_path / "out"), "--expect", str(tmp_path / "expected.npz")],
            capture_output=True, text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        )
        assert run.returncode == 0, run.stdout + run.stderr
    module = subprocess.run([tpuc_binary(), "compile", str(archive), "--mesh", "dp=2,tp=2", "--plan", "dp"],
                            capture_output=True, text=True)
    assert module.returncode == 0 and "sdy.sharding_constraint" in module.stdout, module.stderr


def test_what_does_not_fit_is_refused_by_name():
    model, inputs = MODELS["llama"]
    with pytest.raises(ValueError, match="the option plan needs a mesh"):
        tpuc.Options.parse({"plan": "tp"})
    with pytest.raises(Exception, match="expected NAME=SIZE"):
        tpuc.Mesh.parse("fsdp")
    with pytest.raises(ValueError, match="has no axis 'pp'"):
        tpuc.mark_sharding(torch.zeros(4), "dp=2", ("pp",))
    with pytest.raises(TypeError, match="one entry per dimension"):
        tpuc.mark_sharding(torch.zeros(4), "dp=2", "dp")
    with pytest.raises(Exception, match="works over a mesh axis named tp, but the mesh has dp"):
        torch.compile(model, backend="tpuc", options={"mesh": "dp=2", "plan": "tp"})(*inputs)
    torch._dynamo.reset()
    # (A layout the mesh does not divide is padded, not refused.)
    odd = tpuc.mark_sharding(torch.randn(3, 4), "dp=2", ("dp", None))
    torch.testing.assert_close(torch.compile(lambda x: x * 2, backend="tpuc", options={"mesh": "dp=2"})(odd), odd * 2)
    torch._dynamo.reset()
    elsewhere = torch.compile(lambda x: tpuc.sharding_constraint(x, "tp=2", ("tp",)) * 2, backend="tpuc",
                              options={"mesh": "dp=2", "strict": True})
    with pytest.raises(Exception, match="the constraint is for the mesh tp=2, but the program compiles for dp=2"):
        elsewhere(torch.randn(4))


@pytest.mark.parametrize("mesh,plan", [("dp=2", "dp"), ("fsdp=2", "fsdp"), ("dp=2,fsdp=2", "dp,fsdp")])
def test_batches_and_weights_the_mesh_does_not_divide_are_padded(mesh, plan):
    """An epoch's last batch (5 or 3 rows over 2 devices) and a bias of 3 over fsdp=2 run
    padded across the mesh and come back in their true shapes: inference and a training step
    as in eager."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3))
    twin = copy.deepcopy(model)
    torch._dynamo.reset()
    compiled = torch.compile(twin, backend="tpuc", options={"mesh": mesh, "plan": plan, "strict": True})
    for rows in (5, 3):
        x = torch.randn(rows, 4)
        out = compiled(x)
        assert out.shape == (rows, 3)
        torch.testing.assert_close(out, model(x), **TOL)
    x = torch.randn(5, 4)
    model(x).square().mean().backward()
    compiled(x).square().mean().backward()
    for (path, p), q in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(q.grad, p.grad, **TOL, msg=lambda m, path=path: f"{path}: {m}")


def test_meshes_plans_and_compile_options_are_checked_where_they_are_made():
    """Meshes, plans and compile options are the extension's own classes, checked once by the
    driver's parsers when made and passed on as they are."""
    mesh = tpuc.Mesh((2, 2), ("fsdp", "tp"))
    assert mesh == tpuc.Mesh.parse("fsdp=2, tp=2") == tpuc.Mesh.of("fsdp=2,tp=2")
    assert hash(mesh) == hash(tpuc.Mesh.parse("fsdp=2,tp=2")) and mesh != tpuc.Mesh.parse("tp=2,fsdp=2")
    assert (str(mesh), repr(mesh), mesh.size, mesh.shape, mesh.axis_names) == (
        "fsdp=2,tp=2", "Mesh((2, 2), ('fsdp', 'tp'))", 4, (2, 2), ("fsdp", "tp"))
    for bad, kind, why in [(lambda: tpuc.Mesh((2,), ("a", "b")), ValueError, "needs 1 axis names"),
                           (lambda: tpuc.Mesh.parse("dp=0"), ValueError, "at least 1"),
                           (lambda: tpuc.Mesh.of(3), TypeError, "a mesh is a tpuc.Mesh or its text")]:
        with pytest.raises(kind, match=why):
            bad()

    # A weight's layout from ready plans, from rules (tuples as lists), rules before ready plans.
    weights = [("layers.0.w", "bfloat16", [4, 6]), ("bias", "int64", [6])]
    inputs = [("x", "float32", [8, 4])]
    fsdp = tpuc.Plan("fsdp").resolve("fsdp=2", weights, inputs)
    assert fsdp[0] == ([["fsdp"], []], [[], []]), fsdp  # gathered at use
    ruled = tpuc.Plan({"rules": {"*.w": (None, "tp")}, "ready": "dp"}).resolve(mesh.parse("dp=2,tp=2"), weights, inputs)
    assert ruled[0] == ([[], ["tp"]], None) and ruled[2][0] == [["dp"], []], ruled
    assert tpuc.Plan({"*.w": [None, "tp"]}).resolve("tp=2", weights, [])[0][0] == [[], ["tp"]]
    for bad, kind, why in [(3, TypeError, "a plan is a string"), ("zz", ValueError, "zz"),
                           ({"w": "tp"}, ValueError, "a spec is a list"),
                           ({"rules": [], "ready": "dp"}, ValueError, "unknown or malformed entry")]:
        with pytest.raises(kind, match=why):
            tpuc.Plan(bad)
    with pytest.raises(tpuc.TpucError, match="complex32|dtype"):
        tpuc.Plan("dp").resolve("dp=2", [], [("x", "complex32", [2])])

    options = tpuc.Options.parse({"mesh": "dp=2", "plan": {"*": [None]}, "buckets": [64, 128],
                                  "matmul_precision": "high"})
    assert isinstance(options.mesh, tpuc.Mesh) and isinstance(options.plan, tpuc.Plan)
    assert options.compile is options.compile  # built once
    assert (options.compile.buckets, options.compile.matmul_precision) == ("64,128", "high")
    with pytest.raises(ValueError, match="matmul_precision must be one of"):
        tpuc.Options.parse({"matmul_precision": "fast"})
