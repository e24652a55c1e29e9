"""Programs written for an accelerator, run on the tpuc device unmodified: Hugging Face models
loaded with `device_map="tpuc"` (accelerate), greedy `generate()` and a training step with AdamW,
each against the same program on the CPU."""
import copy
import sys
from pathlib import Path

import pytest
import torch

import tpuc  # noqa: F401  (the device)

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
from bench_decode import build  # noqa: E402

NEW_TOKENS = 4


def test_a_hugging_face_model_loads_onto_the_device_and_generates_as_on_the_cpu(tmp_path):
    build("llama").save_pretrained(tmp_path)
    on_cpu = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    on_device = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, device_map="tpuc")
    assert {p.device for p in on_device.parameters()} == {torch.device("tpuc", 0)}
    prompt = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = on_device(prompt.to("tpuc")).logits
        torch.testing.assert_close(logits.cpu(), on_cpu(prompt).logits, rtol=1e-4, atol=1e-4)
        kwargs = dict(max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
        tokens = on_device.generate(prompt.to("tpuc"), **kwargs)
    assert tokens.device.type == "tpuc"
    assert torch.equal(tokens.cpu(), on_cpu.generate(prompt, **kwargs))


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_hugging_face_training_step_with_adamw_equals_the_cpus(family):
    if family == "gpt2":
        config = transformers.GPT2Config(vocab_size=256, n_positions=64, n_embd=64, n_layer=2, n_head=4)
        torch.manual_seed(0)
        on_cpu = transformers.GPT2LMHeadModel(config)
    else:
        on_cpu = build(family)
    on_cpu.train()
    # No dropout: its draws on the device are not the CPU's.
    for module in on_cpu.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    on_device = copy.deepcopy(on_cpu).to("tpuc")
    tokens = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(2))
    for model, batch in ((on_cpu, tokens), (on_device, tokens.to("tpuc"))):
        # GPT-2's key bias has a zero gradient but for rounding (softmax ignores a shift per
        # row); with Adam's default eps that noise, which differs between CPUs, steps by up to lr.
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, eps=1e-6)
        for _ in range(2):
            loss = model(batch, labels=batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        model.final_loss = loss.item()
    assert on_device.final_loss == pytest.approx(on_cpu.final_loss, rel=1e-5)
    for (name, want), got in zip(on_cpu.named_parameters(), on_device.parameters()):
        torch.testing.assert_close(got.detach().cpu(), want.detach(), rtol=1e-4, atol=1e-5, msg=name)
