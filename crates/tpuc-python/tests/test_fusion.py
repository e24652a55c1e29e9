"""The fusion stage (`fusion="patterns"`, `tpuc compile --fusion patterns`): named patterns of real
models become stablehlo.composite ops tpuc.<pattern> in the compiled module, and the results are
eager's, through the backend, `tpuc.compile_exported` and the CLI."""
import copy
import glob
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from models import Attention, RMSNorm, SwiGLU, zoo

import tpuc

MODELS = {name: (model, inputs) for name, model, inputs in zoo()}
TOL = dict(rtol=1e-5, atol=1e-5)


def composites(text: str, name: str) -> int:
    return text.count(f'name = "{name}"')


def fused_inference(model, inputs, dump_dir, fusion="patterns") -> str:
    """The model compiled with fusion on and run (its results eager's): its compiled module."""
    torch._dynamo.reset()
    options = {"strict": True, "fusion": fusion, "dump_dir": str(dump_dir)}
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend="tpuc", options=options)(*inputs),
                                   model(*inputs), **TOL)
    (text,) = [open(p).read() for p in glob.glob(str(dump_dir / "*.mlir"))]
    return text


@pytest.mark.parametrize("name,fusion", [("llama", "patterns"), ("qwen", "patterns"), ("llama", "kernels")])
def test_every_norm_and_attention_of_a_model_is_one_composite(name, fusion, tmp_path):
    """With kernels, the grouped-query attention's decomposition multiplies each group of query
    heads with its key/value head (a 5-d batched product), nothing repeated."""
    model, inputs = MODELS[name]
    norms = sum(isinstance(m, RMSNorm) for m in model.modules())
    layers = sum(isinstance(m, Attention) for m in model.modules())
    text = fused_inference(model, inputs, tmp_path, fusion)
    attention = next(m for m in model.modules() if isinstance(m, Attention))
    grouped = f"tensor<{inputs[0].shape[0]}x{attention.kv_heads}x{attention.heads // attention.kv_heads}x"
    grouped_products = [line for line in text.splitlines() if "dot_general" in line and grouped in line]
    assert bool(grouped_products) == (fusion == "kernels")
    assert composites(text, "tpuc.rms_norm") == norms > 0
    assert "epsilon = 9.99999997E-7 : f32" in text
    assert composites(text, "tpuc.attention") == layers > 0
    assert "causal = true" in text
    mlps = sum(isinstance(m, SwiGLU) for m in model.modules())
    assert composites(text, "tpuc.gated_mlp") == mlps > 0 and 'activation = "silu"' in text
    # Grouped-query attention: the keys and values enter with their own heads, not repeated.
    calls = [line for line in text.splitlines() if 'name = "tpuc.attention"' in line]
    for line in calls:
        q, k, v = re.search(r"\} : \(([^)]*)\) ->", line).group(1).split(", ")[:3]
        assert q.startswith(f"tensor<{inputs[0].shape[0]}x{attention.heads}x"), line
        assert k.startswith(f"tensor<{inputs[0].shape[0]}x{attention.kv_heads}x"), line
        assert v.startswith(f"tensor<{inputs[0].shape[0]}x{attention.kv_heads}x"), line


@pytest.mark.parametrize("fusion", ["patterns", "kernels"])
def test_a_fused_training_step_matches_eager(fusion, tmp_path):
    """Training: the forward's attention is torch's CPU flash kernel (output and log-sum-exp),
    one composite of two results; gradients as eager's."""
    model, inputs = MODELS["llama"]
    eager, fused = copy.deepcopy(model).train(), copy.deepcopy(model).train()
    torch._dynamo.reset()
    options = {"strict": True, "fusion": fusion, "dump_dir": str(tmp_path)}
    torch.compile(fused, backend="tpuc", options=options)(*inputs).square().mean().backward()
    eager(*inputs).square().mean().backward()
    for (name, got), want in zip(fused.named_parameters(), eager.parameters()):
        torch.testing.assert_close(got.grad, want.grad, **TOL, msg=lambda m, name=name: f"{name}: {m}")
    layers = sum(isinstance(m, Attention) for m in model.modules())
    forward = [open(p).read() for p in glob.glob(str(tmp_path / "*forward.mlir"))]
    assert len(forward) == 1 and composites(forward[0], "tpuc.attention") == layers > 0, forward


def test_fusion_is_kernels_unless_told_and_a_bad_choice_is_named(tmp_path, monkeypatch):
    """The best measured choice (`kernels`) unless an option or TPUC_FUSION says otherwise;
    "none" leaves every op as lowered."""
    monkeypatch.delenv("TPUC_FUSION", raising=False)
    assert tpuc.Options.parse({}).fusion == "kernels"
    model, inputs = MODELS["llama"]
    texts = {}
    for fusion in (None, "none"):
        torch._dynamo.reset()
        dump = tmp_path / str(fusion)
        options = {"strict": True, "dump_dir": str(dump)} | ({} if fusion is None else {"fusion": fusion})
        with torch.no_grad():
            torch.compile(model, backend="tpuc", options=options)(*inputs)
        (texts[fusion],) = [open(p).read() for p in glob.glob(str(dump / "*.mlir"))]
    assert composites(texts[None], "tpuc.attention") > 0
    assert "stablehlo.composite" not in texts["none"]
    with pytest.raises(Exception, match='fusion must be none, patterns or kernels, not "all"'):
        torch.compile(model, backend="tpuc", options={"fusion": "all"})(*inputs)


def test_an_exported_program_fuses_through_the_python_api_and_the_cli(tmp_path):
    model, inputs = MODELS["llama"]
    with torch.no_grad():
        want = model(*inputs)
        program = torch.export.export(model, inputs)
    path = str(tmp_path / "llama.pt2")
    torch.export.save(program, path)
    torch.testing.assert_close(tpuc.compile_exported(path, fusion="patterns", cache_dir="off")(*inputs), want, **TOL)
    np.save(tmp_path / "tokens.npy", inputs[0].numpy())
    np.savez(tmp_path / "want.npz", want.numpy())
    tpuc_cli = os.path.join(os.path.dirname(sys.executable), "tpuc")
    compiled = subprocess.run([tpuc_cli, "compile", path, "--fusion", "patterns", "-o", "-"],
                              capture_output=True, text=True, timeout=120)
    assert compiled.returncode == 0, compiled.stderr
    assert composites(compiled.stdout, "tpuc.rms_norm") == 5
    ran = subprocess.run([tpuc_cli, "run", path, "-i", str(tmp_path / "tokens.npy"), "--fusion", "patterns",
                          "--expect", str(tmp_path / "want.npz"), "--out", str(tmp_path / "out"),
                          "--cache-dir", "off"], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0 and "all 1 outputs match" in ran.stdout + ran.stderr, ran.stderr


def test_a_plan_lays_out_a_fused_training_step_as_an_unfused_one():
    """Sharding propagates through composites: a Llama training step under fsdp x tp holds the
    same collectives in XLA's optimized programs with fusion on as off."""
    here = os.path.dirname(os.path.abspath(__file__))
    counts = []
    for fusion in ("none", "patterns"):
        run = subprocess.run([sys.executable, os.path.join(here, "training_collectives.py"), "fsdp=2,tp=2", "fsdp,tp",
                              "llama", fusion], capture_output=True, text=True, timeout=300, cwd=here,
                             env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
        assert run.returncode == 0, run.stderr[-4000:]
        counts.append(run.stdout.splitlines()[-1])
    assert counts[0] == counts[1] and '"all-gather": 42' in counts[0], counts


def test_attention_written_out_layer_norms_and_mlps_of_min_gpt_are_composites(tmp_path):
    """minGPT writes its attention by hand (scores, a stored boolean mask, softmax, values): one
    causal attention composite per block, the softmax inside it; its layer norms and its MLPs'
    first layer with GELU too."""
    model, inputs = MODELS["mingpt"]
    text = fused_inference(model, inputs, tmp_path)
    norms = sum(isinstance(m, torch.nn.LayerNorm) for m in model.modules())
    assert composites(text, "tpuc.layer_norm") == norms > 0
    calls = [line for line in text.splitlines() if 'name = "tpuc.attention"' in line]
    assert len(calls) == len(model.blocks)
    assert all("causal = true" in line and "scale = 0.353553385" in line for line in calls), calls
    # Each block's MLP: a linear layer and GELU (tanh).
    assert composites(text, "tpuc.linear") == len(model.blocks) == text.count('activation = "gelu_tanh"')


def _hugging_face_llama(attention: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         attn_implementation=attention)
    return LlamaForCausalLM(config).eval()


def _hugging_face_gemma(attention: str):
    """Gemma: GeGLU (its gate's GELU the tanh approximation), norms scaled by `1 + weight`."""
    from transformers import GemmaConfig, GemmaForCausalLM

    config = GemmaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                         max_position_embeddings=64, hidden_activation="gelu_pytorch_tanh",
                         attn_implementation=attention)
    return GemmaForCausalLM(config).eval()


def _hugging_face_gpt2(attention: str):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                        bos_token_id=0, eos_token_id=0, attn_implementation=attention)
    return GPT2LMHeadModel(config).eval()


@pytest.mark.parametrize("make,attention,expected", [
    (_hugging_face_llama, "sdpa", {"rms_norm": 5, "rotary": 4, "attention": 2, "gated_mlp": 2}),
    (_hugging_face_llama, "eager", {"rms_norm": 5, "rotary": 4, "attention": 2, "gated_mlp": 2}),
    (_hugging_face_gemma, "eager", {"rms_norm": 5, "rotary": 4, "attention": 2, "gated_mlp": 2}),
    (_hugging_face_gpt2, "eager", {"layer_norm": 5, "attention": 2}),
], ids=["llama-sdpa", "llama-eager", "gemma-eager", "gpt2-eager"])
def test_hugging_face_models_fuse_with_their_results_unchanged(make, attention, expected, tmp_path):
    """Transformers' own models: attention through SDPA or written out (their eager
    implementation, the causal mask added as a constant), each layer's patterns once."""
    model = make(attention)
    tokens = torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        want = model(tokens).logits
        got = torch.compile(model, backend="tpuc", options={"strict": True, "fusion": "patterns",
                                                            "dump_dir": str(tmp_path)})(tokens).logits
    torch.testing.assert_close(got, want, **TOL)
    text = "".join(open(p).read() for p in glob.glob(str(tmp_path / "*.mlir")))
    counts = {name: composites(text, f"tpuc.{name}") for name in expected}
    assert counts == expected
    calls = [line for line in text.splitlines() if 'name = "tpuc.attention"' in line]
    assert all("causal = true" in line for line in calls), calls
    activation = {"gemma": "gelu_tanh"}.get(make.__name__.removeprefix("_hugging_face_"), "silu")
    mlps = [line for line in text.splitlines() if 'name = "tpuc.gated_mlp"' in line]
    assert all(f'activation = "{activation}"' in line for line in mlps), mlps


@pytest.mark.parametrize("options,attributes", [
    ({}, 'ignore_index = -100 : i64, reduction = "mean"'),
    ({"reduction": "sum", "ignore_index": 3}, 'ignore_index = 3 : i64, reduction = "sum"'),
    ({"label_smoothing": 0.1}, None),
], ids=["mean", "sum", "label-smoothing"])
def test_softmax_with_cross_entropy_is_one_composite(options, attributes, tmp_path):
    """The loss of logits and target classes: one composite of the two (a target equal to
    `ignore_index` left out); label smoothing, another formula, is not matched."""
    classifier = torch.nn.Linear(8, 5)
    x, targets = torch.randn(6, 8), torch.tensor([0, 3, 4, 3, 1, 2])

    def loss(x, targets):
        return torch.nn.functional.cross_entropy(classifier(x), targets, **options)

    with torch.no_grad():
        got = torch.compile(loss, backend="tpuc", options={"strict": True, "fusion": "patterns",
                                                           "dump_dir": str(tmp_path)})(x, targets)
        torch.testing.assert_close(got, loss(x, targets), **TOL)
    (text,) = [open(p).read() for p in glob.glob(str(tmp_path / "*.mlir"))]
    calls = [line for line in text.splitlines() if 'name = "tpuc.cross_entropy"' in line]
    if attributes is None:
        assert calls == []
    else:
        assert len(calls) == 1 and attributes in calls[0], calls
        # Its operands: the logits and the targets.
        assert "(tensor<6x5xf32>, tensor<6xi64>) -> tensor<f32>" in calls[0]


class _WrittenOutCausalAttention(torch.nn.Module):
    """Attention written out: scores scaled by hand, a boolean mask made in the graph (a
    constant to the compiler; a buffer would be an input, of contents unknown)."""

    def forward(self, q, k, v):
        positions = q.shape[-2]
        hidden = torch.ones(positions, positions, dtype=torch.bool).triu(1)
        scores = (q @ k.transpose(-2, -1)) / q.shape[-1] ** 0.5
        return scores.masked_fill(hidden, float("-inf")).softmax(-1) @ v


@pytest.mark.parametrize("positions,blocked", [(16, False), (1024, True)])
def test_written_out_causal_attention_computes_its_mask_from_positions(positions, blocked, tmp_path):
    """With `kernels`, attention a model writes out with a stored causal mask computes the mask
    from positions (the stored one left unread), in blocks of keys when the sequence is long;
    the results are eager's."""
    q, k, v = (torch.randn(1, 2, positions, 16) for _ in range(3))
    text = fused_inference(_WrittenOutCausalAttention(), (q, k, v), tmp_path, "kernels")
    calls = [line for line in text.splitlines() if 'name = "tpuc.attention"' in line]
    assert len(calls) == 1 and "causal = true" in calls[0], calls
    decomposition = text[text.index("func.func private @tpuc_attention"):]
    assert "stablehlo.iota" in decomposition
    assert ("stablehlo.while" in decomposition) == blocked


def test_long_attention_is_computed_in_blocks_with_memory_linear_in_the_sequence(tmp_path):
    """With `kernels`, attention over 2048 positions runs over blocks of 256 keys with an online
    softmax: the results are the plain form's, and XLA's temporaries (read from `tpuc run`)
    shrink from the [heads, 2048, 2048] scores to a block's."""

    class Attention(torch.nn.Module):
        def forward(self, q, k, v):
            k, v = (t.repeat_interleave(2, dim=1) for t in (k, v))
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    inputs = (torch.randn(1, 4, 2048, 32), torch.randn(1, 2, 2048, 32), torch.randn(1, 2, 2048, 32))
    with torch.no_grad():
        want = Attention()(*inputs)
    path = tmp_path / "attention.pt2"
    torch.export.save(torch.export.export(Attention(), inputs), path)
    np.savez(tmp_path / "inputs.npz", *[t.numpy() for t in inputs])
    np.savez(tmp_path / "want.npz", want.numpy())
    tpuc_cli = os.path.join(os.path.dirname(sys.executable), "tpuc")
    temporaries = {}
    for fusion in ("patterns", "kernels"):
        ran = subprocess.run([tpuc_cli, "run", str(path), "-i", str(tmp_path / "inputs.npz"), "--fusion", fusion,
                              "--expect", str(tmp_path / "want.npz"), "--out", str(tmp_path / fusion),
                              "--cache-dir", "off"], capture_output=True, text=True, timeout=120)
        output = ran.stdout + ran.stderr
        assert ran.returncode == 0 and "all 1 outputs match" in output, output
        amount, unit = re.search(r"([\d.]+) (B|KiB|MiB|GiB) of temporaries", output).groups()
        temporaries[fusion] = float(amount) * {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[unit]
    # The plain form holds the 4 x 2048 x 2048 float32 scores (64 MiB) at least.
    assert temporaries["patterns"] >= 64 << 20
    assert temporaries["kernels"] < temporaries["patterns"] / 4, temporaries
    compiled = subprocess.run([tpuc_cli, "compile", str(path), "--fusion", "kernels", "--emit", "ir"],
                              capture_output=True, text=True, timeout=120)
    assert "stablehlo.while" in compiled.stdout and "x2048x256xf32>" in compiled.stdout


def test_a_torchvision_vision_transformer_block_fuses(tmp_path):
    """torchvision's ViT encoder block: its layer norms, its attention (nn.MultiheadAttention
    through SDPA) and its MLP's first layer with exact GELU."""
    from torchvision.models.vision_transformer import EncoderBlock

    block = EncoderBlock(num_heads=4, hidden_dim=32, mlp_dim=64, dropout=0.0, attention_dropout=0.0).eval()
    text = fused_inference(block, (torch.randn(2, 10, 32),), tmp_path)
    assert {name: composites(text, f"tpuc.{name}") for name in ("layer_norm", "attention", "linear")} == {
        "layer_norm": 2, "attention": 1, "linear": 1}
    assert 'activation = "gelu"' in text


def test_linear_layers_with_their_activation_are_composites(tmp_path):
    model, inputs = MODELS["dlrm"]
    text = fused_inference(model, inputs, tmp_path)
    relus = sum(isinstance(m, torch.nn.ReLU) for m in model.modules())
    assert composites(text, "tpuc.linear") == relus == text.count('activation = "relu"') > 0


def test_a_llama_block_as_hugging_face_writes_it_fuses_every_pattern():
    """testdata's Llama block (rotate_half rotary embedding, grouped-query attention through
    repeat_interleave, SwiGLU): each pattern once per use, through `tpuc compile`."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    archive = os.path.join(root, "testdata", "lowering", "llama_block.pt2")
    tpuc_cli = os.path.join(os.path.dirname(sys.executable), "tpuc")
    compiled = subprocess.run([tpuc_cli, "compile", archive, "--fusion", "patterns", "-o", "-"],
                              capture_output=True, text=True, timeout=120)
    assert compiled.returncode == 0, compiled.stderr
    counts = {name: composites(compiled.stdout, f"tpuc.{name}")
              for name in ("rms_norm", "rotary", "attention", "gated_mlp")}
    assert counts == {"rms_norm": 2, "rotary": 2, "attention": 1, "gated_mlp": 1}
    # Alike decompositions are written once: the two norms share one function.
    assert compiled.stdout.count("func.func private @tpuc_rms_norm_impl") == 1


FUSED_EAGER = """
import glob, os, sys, torch
sys.path.insert(0, {here!r})
from models import zoo
import tpuc
model, inputs = next((m, i) for n, m, i in zoo() if n == "llama")
device_model = type(model)().to("tpuc")
device_model.load_state_dict(model.state_dict())
tpuc.device.fused(True)
with torch.no_grad():
    got = device_model(*[x.to("tpuc") for x in inputs]).cpu()
    want = model(*inputs)
tpuc.device.fused(False)
torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
texts = [open(p).read() for p in glob.glob(os.path.join(os.environ["TPUC_DUMP_DIR"], "*fused*.mlir"))]
print(sum(t.count('name = "tpuc.rms_norm"') for t in texts), sum(t.count('name = "tpuc.attention"') for t in texts))
"""


def test_fused_eager_goes_through_the_same_fusion(tmp_path):
    """TPUC_FUSION reaches the device's programs: a fused run of the zoo's Llama on the tpuc
    device holds its norms and attentions as composites, with eager's results."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, TPUC_FUSION="patterns", TPUC_DUMP_DIR=str(tmp_path / "dump"),
               TPUC_CACHE_DIR=str(tmp_path / "cache"), TF_CPP_MIN_LOG_LEVEL="3")
    run = subprocess.run([sys.executable, "-c", FUSED_EAGER.format(here=here)], capture_output=True, text=True,
                         timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-4000:]
    norms, attentions = (int(n) for n in run.stdout.split()[-2:])
    model, _ = MODELS["llama"]
    assert norms == sum(isinstance(m, RMSNorm) for m in model.modules())
    assert attentions == sum(isinstance(m, Attention) for m in model.modules())
