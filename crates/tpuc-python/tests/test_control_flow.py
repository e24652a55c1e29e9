"""torch's control-flow operators (`torch.cond`, `while_loop`, `scan`, `map`) through the compile backend in
strict mode, forward and backward, through `tpuc.compile_exported`, and on the tpuc device in
strict and fused eager modes, against eager torch on the CPU."""
import copy
import json
import os
import subprocess
import sys

import pytest
import torch
from models import Rnn
from torch._higher_order_ops.associative_scan import associative_scan
from torch._higher_order_ops.map import map as map_rows
from torch._higher_order_ops.while_loop import while_loop

import tpuc

TOL = dict(rtol=1e-5, atol=1e-5)


def compiled(model):
    torch._dynamo.reset()
    return torch.compile(model, backend="tpuc", options={"strict": True}, dynamic=False)


class Branches(torch.nn.Module):
    """A branch on a tensor's value: two operands (a weight among them), two results."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(3, 3))

    def forward(self, x):
        def positive(x, w):
            return (x @ w).tanh(), x.sum(0)

        def negative(x, w):
            return (x @ w.t()).sin(), x.amax(0)

        return torch.cond(x.sum() > 0, positive, negative, (x, self.w))


@torch.compiler.nested_compile_region
def residual_block(x, w, b):
    return torch.relu(x @ w + b) + x


class Repeated(torch.nn.Module):
    """A block repeated with weights of its own per layer, captured once by
    torch.compiler.nested_compile_region (invoke_subgraph)."""

    def __init__(self, layers=4):
        super().__init__()
        self.ws = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(4, 4) * 0.5) for _ in range(layers)])
        self.bs = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(4) * 0.1) for _ in range(layers)])

    def forward(self, x):
        for w, b in zip(self.ws, self.bs):
            x = residual_block(x, w, b)
        return x


class Generation(torch.nn.Module):
    """A generation loop: a counter, the tokens so far and a state, for as many steps as a
    tensor says, reading the model's weight from the enclosing graph."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 4) * 0.5)

    def forward(self, state, steps):
        def more(i, tokens, state):
            return i < steps

        def step(i, tokens, state):
            state = torch.tanh(state @ self.w)
            token = state.argmax(-1)
            tokens = torch.where(torch.arange(8, device=state.device) == i, token, tokens)
            return i + 1, tokens, state

        start = (torch.zeros((), dtype=torch.int64, device=state.device), torch.zeros(8, dtype=torch.int64, device=state.device),
                 state)
        return while_loop(more, step, start)


@pytest.mark.parametrize("reverse", [False, True])
def test_an_rnn_written_with_scan_runs_as_in_eager(reverse):
    # (scan's backward cannot be traced by aot_autograd with decompositions in torch 2.15: its
    # own aot_eager_decomp_partition raises "scan might be aliasing the input or the output".)
    torch.manual_seed(0)
    model = Rnn(reverse)
    xs, h = torch.randn(2, 5, 3), torch.randn(2, 4)
    with torch.no_grad():
        for got, want in zip(compiled(model)(xs, h), model(xs, h)):
            torch.testing.assert_close(got, want, **TOL)


def test_map_applies_a_function_to_each_row():
    def rows(xs, y):
        return map_rows(lambda x, y: (x * y + x.amax(), x.sum()), xs, y)

    xs, y = torch.randn(4, 3), torch.randn(3)
    for got, want in zip(compiled(rows)(xs, y), rows(xs, y)):
        torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize("mode", ["pointwise", "generic"])
def test_associative_scan_runs_and_trains_as_in_eager(mode):
    """Running sums along a middle dimension, and a linear recurrence (pairs combined as affine
    maps) along the first, with their gradients."""
    def scans(x, a, b):
        sums = associative_scan(lambda u, v: u + v, x, dim=1, combine_mode=mode)
        gains, states = associative_scan(lambda u, v: (u[0] * v[0], u[1] * v[0] + v[1]), (a, b), dim=0,
                                         combine_mode=mode)
        return sums, gains, states

    torch.manual_seed(0)
    inputs = [torch.randn(3, 6), torch.rand(5, 2) + 0.5, torch.randn(5, 2)]
    grads = []
    for run in (compiled(scans), scans):
        leaves = [t.clone().requires_grad_() for t in inputs]
        results = run(*leaves)
        sum((r * torch.linspace(0.5, 1.5, r.numel()).view_as(r)).sum() for r in results).backward()
        grads.append((results, [t.grad for t in leaves]))
    (got, got_grads), (want, want_grads) = grads
    for g, w in zip([*got, *got_grads], [*want, *want_grads]):
        torch.testing.assert_close(g, w, **TOL)


def test_a_repeated_block_is_one_function_called_from_each_site(tmp_path):
    """Forward and backward (aot_autograd splits the block into a forward and a backward
    function, each called per layer), and the exported program (Dynamo's export keeps the
    block captured; the default export inlines it)."""
    torch.manual_seed(0)
    model, x = Repeated(), torch.randn(3, 4)
    # Fusion off: its composites' private functions would be counted with the block's.
    fast = torch.compile(copy.deepcopy(model), backend="tpuc",
                         options={"strict": True, "dump_dir": str(tmp_path), "fusion": "none"})
    torch.testing.assert_close(fast(x), model(x), **TOL)
    fast(x).square().sum().backward()
    model(x).square().sum().backward()
    for got, want in zip(fast._orig_mod.parameters(), model.parameters()):
        torch.testing.assert_close(got.grad, want.grad, **TOL)
    for part in ("forward", "backward"):
        (text,) = [p.read_text() for p in tmp_path.glob(f"*_{part}.mlir")]
        assert text.count("func.func private") == 1 and text.count("call @") >= 3, text
    with torch.no_grad():
        program = tpuc.compile_exported(torch.export.export(model, (x,), strict=True))
        torch.testing.assert_close(program(x), model(x), **TOL)


@torch.compiler.nested_compile_region
def dropped(x):
    return torch.nn.functional.dropout(x, 0.5, training=True)


def test_a_repeated_block_that_draws_random_numbers_draws_anew_at_each_call(tmp_path):
    """The generator's state goes into the block's function and comes out of it: each call
    (one function for all) drops its own elements."""
    def layers(x):
        return [dropped(x) for _ in range(4)]

    masks = torch.compile(layers, backend="tpuc", options={"strict": True, "dump_dir": str(tmp_path)})(
        torch.ones(64, 64))
    for m in masks:
        assert set(m.unique().tolist()) == {0.0, 2.0} and 0.4 < (m == 0).float().mean() < 0.6
    for a, b in zip(masks, masks[1:]):
        assert (a != b).any()
    (text,) = [p.read_text() for p in tmp_path.glob("*.mlir")]
    assert text.count("func.func private") == 1 and text.count("call @") >= 3, text


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_cond_runs_and_trains_through_the_branch_its_predicate_picks(sign):
    torch.manual_seed(0)
    model = Branches()
    x = torch.randn(2, 3).abs() * sign
    fast = compiled(model)
    for got, want in zip(fast(x), model(x)):
        torch.testing.assert_close(got, want, **TOL)
    grads = []
    for run in (fast, model):
        model.zero_grad()
        xg = x.clone().requires_grad_()
        sum(r.sum() for r in run(xg)).backward()
        grads.append((xg.grad, model.w.grad.clone()))
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize("steps", [0, 1, 5])
def test_a_generation_loop_runs_as_many_steps_as_a_tensor_says(steps):
    torch.manual_seed(0)
    model = Generation()
    state = torch.randn(4)
    with torch.no_grad():
        got = compiled(model)(state, torch.tensor(steps))
        want = model(state, torch.tensor(steps))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **TOL)
    assert got[0].item() == steps


def test_an_exported_program_with_control_flow_compiles_ahead_of_time(tmp_path):
    torch.manual_seed(0)
    model = Branches()
    x = torch.randn(2, 3)
    program = tpuc.compile_exported(torch.export.export(model, (x,)))
    for inputs in (x.abs(), -x.abs()):
        for got, want in zip(program(inputs), model(inputs)):
            torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize("fused", [False, True])
def test_control_flow_runs_on_the_device_in_eager(fused):
    """In eager, torch.cond reads its predicate (a value read back: a fused run ends there) and
    runs the branch it picks; while_loop reads its condition each step."""
    torch.manual_seed(0)
    model, loop = Branches(), Generation()
    device_model, device_loop = Branches().to("tpuc"), Generation().to("tpuc")
    device_model.load_state_dict(model.state_dict())
    device_loop.load_state_dict(loop.state_dict())
    x, state = torch.randn(2, 3), torch.randn(4)
    tpuc.device.fused(fused)
    try:
        with torch.no_grad():
            for inputs in (x.abs(), -x.abs()):
                for got, want in zip(device_model(inputs.to("tpuc")), model(inputs)):
                    torch.testing.assert_close(got.cpu(), want, **TOL)
            got, want = device_loop(state.to("tpuc"), torch.tensor(3).to("tpuc")), loop(state, torch.tensor(3))
            for g, w in zip(got, want):
                torch.testing.assert_close(g.cpu(), w, **TOL)
    finally:
        tpuc.device.fused(False)


# The loop of an RNN written with scan, over batch-first inputs, laid out by a plan: under dp the
# loop runs on each device's rows and nothing communicates; under fsdp the two weights are
# gathered once, before the loop, never in its body.
LOOP_COLLECTIVES = {("dp=2", "dp"): {}, ("fsdp=2", "fsdp"): {"all-gather": 2}}


@pytest.mark.parametrize("mesh,plan", list(LOOP_COLLECTIVES), ids=[m for m, _ in LOOP_COLLECTIVES])
def test_a_loop_under_a_sharding_plan_runs_on_each_devices_part(mesh, plan):
    torch.manual_seed(0)
    rnn = Rnn()
    xs, h = torch.randn(4, 6, 3), torch.randn(4, 4)
    options = {"mesh": mesh, "plan": plan, "strict": True}
    with torch.no_grad():
        for got, want in zip(torch.compile(rnn, backend="tpuc", options=options)(xs, h), rnn(xs, h)):
            torch.testing.assert_close(got, want, **TOL)
    # A branch's backward under the plan, too.
    model = Branches()
    x = torch.randn(4, 3)
    grads = []
    for run in (torch.compile(model, backend="tpuc", options=options), model):
        model.zero_grad()
        sum(r.sum() for r in run(x)).backward()
        grads.append(model.w.grad.clone())
    torch.testing.assert_close(*grads, **TOL)
    here = os.path.dirname(os.path.abspath(__file__))
    run = subprocess.run([sys.executable, os.path.join(here, "training_collectives.py"), mesh, plan, "rnn"],
                         capture_output=True, text=True, timeout=300, cwd=here,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert run.returncode == 0, run.stderr[-4000:]
    (counts,) = json.loads(run.stdout.splitlines()[-1])
    want = LOOP_COLLECTIVES[(mesh, plan)]
    assert counts == {kind: want.get(kind, 0) for kind in counts}, counts


@torch.library.custom_op("tpuc_test::bump", mutates_args=("x",))
def bump(x: torch.Tensor, k: float) -> None:
    x.add_(k)


@bump.register_fake
def _(x, k):
    return None


def bumped(x):
    y = x.clone()
    bump(y, 2.0)
    return y * 3


def test_an_operator_running_a_custom_op_tpuc_does_not_know_is_refused_naming_both():
    """A custom op that mutates its input reaches tpuc as auto_functionalized of it: refused by
    name, with the user's line, through the backend and in an exported archive."""
    x = torch.randn(3)
    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"auto_functionalized_v2 of tpuc_test\.bump\.default x1 \(first at .*"
                       r"test_control_flow\.py"):
        torch.compile(bumped, backend="tpuc", options={"strict": True})(x)

    class Bumped(torch.nn.Module):
        def forward(self, x):
            return bumped(x)

    program = torch.export.export(Bumped(), (x,)).run_decompositions()
    with pytest.raises(tpuc.TpucError, match=r"auto_functionalized_v2 of tpuc_test\.bump\.default \(node "
                       r"auto_functionalized_v2\) at .*test_control_flow\.py"):
        tpuc.compile_exported(program)
