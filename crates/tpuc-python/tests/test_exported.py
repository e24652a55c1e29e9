"""tpuc.compile_exported: torch.export programs compiled ahead of time from Python, run with
torch tensors, saved and loaded with their executables; errors as clear as the CLI's."""

import pytest
import torch

import tpuc

TOL = dict(rtol=1e-5, atol=1e-5)


class TwoOutputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(6, 3)

    def forward(self, x, y):
        return self.linear(x).relu() + y, x.sum()


@pytest.fixture(scope="module")
def exported():
    torch.manual_seed(0)
    model = TwoOutputs()
    args = (torch.randn(4, 6), torch.randn(4, 3))
    return model, args, torch.export.export(model, args)


def test_an_exported_program_runs_as_the_model_does(exported, tmp_path):
    model, args, program = exported
    compiled = tpuc.compile_exported(program, cache_dir="off")
    assert [name for name, _, _ in compiled.inputs] == ["x", "y"]
    assert compiled.inputs[0][1:] == (torch.float32, [4, 6])
    assert compiled.outputs == [(torch.float32, [4, 3]), (torch.float32, [])]
    for got, want in zip(compiled(*args), model(*args)):
        torch.testing.assert_close(got, want.detach(), **TOL)
    # From the archive's path as well, weights as they were saved.
    torch.export.save(program, tmp_path / "model.pt2")
    from_file = tpuc.compile_exported(str(tmp_path / "model.pt2"), cache_dir="off")
    torch.testing.assert_close(from_file(*args)[0], model(*args)[0].detach(), **TOL)


def test_its_stablehlo_comes_as_text_or_bytecode(exported):
    _, _, program = exported
    compiled = tpuc.compile_exported(program, cache_dir="off")
    text = compiled.stablehlo()
    assert "stablehlo.dot_general" in text or "stablehlo.dot" in text
    assert compiled.stablehlo("bytecode").startswith(b"ML\xefR")
    inline = compiled.stablehlo(weights="inline")
    assert "dense<" in inline and inline.count("%arg") < text.count("%arg")
    with pytest.raises(ValueError, match="format is 'text' or 'bytecode'"):
        compiled.stablehlo("xml")


def test_a_saved_program_loads_its_executable_without_compiling(exported, tmp_path):
    model, args, program = exported
    compiled = tpuc.compile_exported(program, cache_dir="off")
    compiled.save(tmp_path / "saved")
    loaded = tpuc.load(tmp_path / "saved")
    assert loaded.cache == "hit"
    torch.testing.assert_close(loaded(*args)[0], model(*args)[0].detach(), **TOL)
    # An executable damaged on disk is not run: loading says so, or compiles again when asked.
    executables = tmp_path / "saved" / "executables"
    for entry in executables.iterdir():
        data = bytearray(entry.read_bytes())
        data[len(data) // 2] ^= 0xFF
        entry.write_bytes(bytes(data))
    with pytest.raises(tpuc.TpucError, match="not for this plugin and tpuc: pass recompile=True"):
        tpuc.load(tmp_path / "saved")
    again = tpuc.load(tmp_path / "saved", recompile=True)
    torch.testing.assert_close(again(*args)[0], model(*args)[0].detach(), **TOL)
    assert tpuc.load(tmp_path / "saved").cache == "hit"  # the recompiled executable was stored
    # save() refuses to replace what is not a saved program.
    (tmp_path / "other").mkdir()
    with pytest.raises(FileExistsError, match="not a saved tpuc program"):
        compiled.save(tmp_path / "other")


def test_bad_uses_are_clear_errors(exported, tmp_path):
    _, args, program = exported
    compiled = tpuc.compile_exported(program, cache_dir="off")
    with pytest.raises(TypeError, match=r"takes 2 input\(s\) \(x, y\), 1 given"):
        compiled(args[0])
    with pytest.raises(TypeError, match=r"input 1 \(y\) is a str"):
        compiled(args[0], "y")
    with pytest.raises(tpuc.TpucError, match=r"input 0 \(x\) must be float32 \[4, 6\], but float32 \[5, 6\]"):
        compiled(torch.randn(5, 6), args[1])
    with pytest.raises(TypeError, match="takes a torch.export.ExportedProgram or the path"):
        tpuc.compile_exported(3)
    with pytest.raises(FileNotFoundError, match="no such file"):
        tpuc.compile_exported(tmp_path / "missing.pt2")
    (tmp_path / "broken.pt2").write_bytes(b"PK\x03\x04 not an archive")
    with pytest.raises(tpuc.TpucError, match=r"broken\.pt2: not a valid \.pt2 archive"):
        tpuc.compile_exported(tmp_path / "broken.pt2")
    with pytest.raises(tpuc.TpucError, match="unknown PJRT plugin `nosuch`"):
        tpuc.compile_exported(program, plugin="nosuch")
    with pytest.raises(tpuc.TpucError, match="matmul precision must be highest, high or default"):
        tpuc.compile_exported(program, matmul_precision="fast")
    with pytest.raises(TypeError, match="sizes maps symbols to sizes"):
        tpuc.compile_exported(program, sizes={"s0": "8"})
    with pytest.raises(FileNotFoundError, match="not a saved tpuc program"):
        tpuc.load(tmp_path)
    (tmp_path / "damaged").mkdir()
    (tmp_path / "damaged" / "tpuc.json").write_text("{not json")
    with pytest.raises(tpuc.TpucError, match="tpuc.json is damaged"):
        tpuc.load(tmp_path / "damaged")


def test_a_dynamic_program_runs_at_the_sizes_given(tmp_path):
    model = torch.nn.Linear(6, 3)
    batch = torch.export.Dim("batch", min=2, max=64)
    program = torch.export.export(model, (torch.randn(4, 6),), dynamic_shapes=({0: batch},))
    name = program.graph_signature.user_inputs[0]
    symbol = str(next(n for n in program.graph.nodes if n.name == name).meta["val"].shape[0])
    compiled = tpuc.compile_exported(program, sizes={symbol: 8}, cache_dir="off")
    x = torch.randn(8, 6)
    torch.testing.assert_close(compiled(x), model(x).detach(), **TOL)
    assert compiled.inputs[0][2] == [8, 6]


def test_a_program_whose_sizes_tensor_values_decide_is_refused_by_kind():
    """`.item()` used as an index: export records a size u0 only the data decides, which no size
    given before the run may fix (testdata/lowering/errors/value_sized.pt2)."""
    import pathlib

    archive = pathlib.Path(__file__).resolve().parents[3] / "testdata" / "lowering" / "errors" / "value_sized.pt2"
    for sizes in ({}, {"u0": 2}):
        with pytest.raises(tpuc.DynamicSizeError, match="tensor values decide the size u0") as raised:
            tpuc.compile_exported(str(archive), cache_dir="off", sizes=sizes)
        assert raised.value.value_decided is True


class _Regions(torch.nn.Module):
    """Regions torch.export keeps as higher-order ops: one under `torch.no_grad()` (Hugging
    Face's rotary embeddings), one with autocast turned off, optionally one with it on."""

    def __init__(self, autocast_on: bool = False):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.autocast_on = autocast_on

    def forward(self, x):
        with torch.no_grad():
            angles = x.float().to(x.device) * 2.0
        with torch.autocast("cpu", enabled=self.autocast_on):
            y = self.linear(angles).cos()
        return y + x


def test_grad_mode_and_disabled_autocast_regions_run_as_their_bodies(tmp_path):
    torch.manual_seed(0)
    model, x = _Regions(), torch.randn(3, 4)
    program = torch.export.export(model, (x,))
    targets = {str(n.target) for n in program.graph.nodes}
    assert any("wrap_with_set_grad_enabled" in t for t in targets), targets
    assert any("wrap_with_autocast" in t for t in targets), targets
    compiled = tpuc.compile_exported(program, cache_dir="off")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), **TOL)


def test_an_enabled_autocast_region_is_refused_by_name():
    model, x = _Regions(autocast_on=True), torch.randn(3, 4)
    program = torch.export.export(model, (x,))
    with pytest.raises(tpuc.TpucError, match="enabled torch.autocast region"):
        tpuc.compile_exported(program, cache_dir="off")


def test_a_hugging_face_model_runs_from_its_default_export(tmp_path):
    """`torch.export.export` of a Transformers model as a user writes it (no decompositions
    run): its rotary embedding's no-grad region and device moves included, through `tpuc run`;
    `tpuc compile` finds each layer's patterns as the backend does (the eager attention's mask,
    computed in the graph, read as causal)."""
    import os
    import subprocess
    import sys

    import numpy as np
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         attn_implementation="eager")
    model = LlamaForCausalLM(config).eval()

    class Logits(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, tokens):
            return self.model(tokens).logits

    tokens = torch.randint(0, 64, (2, 16))
    torch.export.save(torch.export.export(Logits(), (tokens,)), tmp_path / "llama.pt2")
    np.savez(tmp_path / "inputs.npz", tokens.numpy())
    with torch.no_grad():
        np.savez(tmp_path / "want.npz", Logits()(tokens).numpy())
    tpuc_cli = os.path.join(os.path.dirname(sys.executable), "tpuc")
    ran = subprocess.run([tpuc_cli, "run", "llama.pt2", "-i", "inputs.npz", "--expect", "want.npz",
                          "--out", "out", "--cache-dir", "off"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert ran.returncode == 0 and "all 1 outputs match" in ran.stdout + ran.stderr, ran.stderr
    compiled = subprocess.run([tpuc_cli, "compile", "llama.pt2", "-o", "llama.mlir"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
    assert compiled.returncode == 0, compiled.stderr
    text = (tmp_path / "llama.mlir").read_text()
    counts = {name: text.count(f'name = "tpuc.{name}"') for name in ("rms_norm", "rotary", "attention", "gated_mlp")}
    assert counts == {"rms_norm": 5, "rotary": 4, "attention": 2, "gated_mlp": 2}, counts
    assert text.count("causal = true") == 2
