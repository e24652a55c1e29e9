"""FlexAttention on the tpuc device (in eager, compiled by tpuc in strict mode, and through
torch.compile's default backend, which hands graphs over the device's tensors to tpuc), forward
and backward, against attention on the CPU; block masks made by a compiled `create_block_mask`."""
import warnings

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from tpuc import default_compiler

TOL = {"rtol": 1e-4, "atol": 1e-5}


def causal(b, h, q, kv):
    return q >= kv


def compiled(how):
    if how == "eager":
        return lambda f: f
    if how == "tpuc":
        return lambda f: torch.compile(f, backend="tpuc", options={"strict": True})
    return torch.compile  # torch.compile's default backend


@pytest.mark.parametrize("how", ["eager", "tpuc", "default"])
def test_causal_flex_attention_and_its_gradient_match_the_cpu(how):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 32, 8) for _ in range(3))
    with warnings.catch_warnings():
        # torch warns that flex_attention without torch.compile materialises every score.
        warnings.filterwarnings("ignore", "flex_attention called without torch.compile")
        mask = compiled(how)(create_block_mask)(causal, 2, None, 32, 32, device="tpuc")
        assert mask.kv_num_blocks.device.type == "tpuc"
        on_device = [t.to("tpuc").requires_grad_() for t in (q, k, v)]
        warnings.simplefilter("error")  # a compiled graph runs nothing in eager torch
        warnings.filterwarnings("ignore", "flex_attention called without torch.compile")
        out = compiled(how)(flex_attention)(*on_device, block_mask=mask)
        out.square().sum().backward()
    cpu = [t.clone().requires_grad_() for t in (q, k, v)]
    want = torch.nn.functional.scaled_dot_product_attention(*cpu, is_causal=True)
    want.square().sum().backward()
    torch.testing.assert_close(out.detach().cpu(), want.detach(), **TOL)
    for got, expected in zip(on_device, cpu):
        torch.testing.assert_close(got.grad.cpu(), expected.grad, **TOL)


def test_a_score_function_with_a_captured_tensor_and_grouped_heads_match_the_cpu():
    torch.manual_seed(0)
    slopes = torch.rand(4)

    def alibi(score, b, h, q, kv):
        return score - slopes_now[h] * (q - kv).abs()

    q, k, v = torch.randn(1, 4, 16, 8), torch.randn(1, 2, 16, 8), torch.randn(1, 2, 16, 8)
    slopes_now = slopes
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "flex_attention called without torch.compile")
        want = flex_attention(q, k, v, score_mod=alibi, enable_gqa=True)
    slopes_now = slopes.to("tpuc")
    f = torch.compile(lambda q, k, v: flex_attention(q, k, v, score_mod=alibi, enable_gqa=True), backend="tpuc",
                      options={"strict": True})
    got = f(*(t.to("tpuc") for t in (q, k, v)))
    torch.testing.assert_close(got.cpu(), want, **TOL)


def test_only_graphs_over_the_device_are_handed_to_tpuc():
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    assert default_compiler.on_device(gm, [torch.ones(2, device="tpuc")])
    assert not default_compiler.on_device(gm, [torch.ones(2)])
    graph = torch.fx.Graph()
    made = graph.call_function(torch.ones, (2,), {"device": "tpuc"})
    made.meta["example_value"] = torch.empty(2, device="tpuc")
    graph.output(made)
    assert default_compiler.on_device(torch.fx.GraphModule({}, graph), [])
