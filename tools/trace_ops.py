#!/usr/bin/env python3
"""The ATen ops real graphs bring: the model zoo, torchvision and Hugging Face architectures
(small configurations, random weights) traced in three forms, each op with the models that
brought it, written to docs/traced_ops.json (tools/gen_ops_doc.py turns the ops outside the
core set into docs/ops.md's "Non-core ops in real graphs" section, with tpuc's status).

  export     torch.export.export: the undecomposed graph `tpuc compile` reads from a .pt2
  core       the same after run_decompositions(): core ATen (and what torch keeps)
  training   torch.compile through aot_autograd with a training step: the forward and
             backward graphs the backend gets (torch's core-ATen decompositions applied, as
             the backend applies them)

usage: .venv/bin/python tools/trace_ops.py [--models NAME ...]
"""
import argparse
import json
import os
import sys
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import torch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "docs", "traced_ops.json")
sys.path.insert(0, os.path.join(ROOT, "crates", "tpuc-python", "tests"))


def torchvision_models():
    import torchvision.models as tv

    image = (torch.randn(2, 3, 64, 64),)
    return [
        ("torchvision.resnet18", tv.resnet18(num_classes=10), image),
        ("torchvision.mobilenet_v3_small", tv.mobilenet_v3_small(num_classes=10), image),
        ("torchvision.efficientnet_b0", tv.efficientnet_b0(num_classes=10), image),
        ("torchvision.convnext_tiny", tv.convnext_tiny(num_classes=10), image),
        ("torchvision.vit", tv.VisionTransformer(image_size=64, patch_size=16, num_layers=2, num_heads=2,
                                                 hidden_dim=32, mlp_dim=64, num_classes=10), image),
        ("torchvision.squeezenet", tv.squeezenet1_1(num_classes=10), image),
        ("torchvision.densenet", tv.DenseNet(growth_rate=8, block_config=(2, 2), num_init_features=16,
                                             num_classes=10), image),
        ("torchvision.shufflenet", tv.shufflenet_v2_x0_5(num_classes=10), image),
    ]


def hugging_face_models():
    import transformers as hf

    tokens = (torch.randint(0, 100, (2, 12)),)
    small = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    return [
        ("hf.bert", hf.BertModel(hf.BertConfig(**small, max_position_embeddings=64)), tokens),
        ("hf.gpt2", hf.GPT2Model(hf.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=2, n_positions=64, use_cache=False)),
         tokens),
        ("hf.llama", hf.LlamaModel(hf.LlamaConfig(**small, num_key_value_heads=1, max_position_embeddings=64, use_cache=False)),
         tokens),
        ("hf.t5", hf.T5EncoderModel(hf.T5Config(vocab_size=100, d_model=32, d_kv=16, d_ff=64, num_layers=2,
                                                num_heads=2)), tokens),
    ]


def call_ops(gm) -> set:
    return {str(n.target) for n in gm.graph.nodes
            if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)}


def traced_training(model, inputs) -> set:
    """The ops of the forward and backward graphs aot_autograd makes for a training step."""
    from torch._decomp import core_aten_decompositions
    from torch._functorch.aot_autograd import aot_module_simplified

    seen = set()

    def backend(gm, example_inputs):
        def record(g, _):
            seen.update(call_ops(g))
            return g.forward
        return aot_module_simplified(gm, example_inputs, fw_compiler=record, bw_compiler=record,
                                     decompositions=core_aten_decompositions())

    torch._dynamo.reset()
    compiled = torch.compile(model.train(), backend=backend)
    out = compiled(*inputs)
    out = out[0] if isinstance(out, (tuple, list)) else getattr(out, "last_hidden_state", out)
    out.float().mean().backward()
    return seen


def trace(name, model, inputs) -> dict:
    forms = {}
    model = model.eval()
    try:
        ep = torch.export.export(model, inputs)
        forms["export"] = call_ops(ep.graph_module)
        forms["core"] = call_ops(ep.run_decompositions().graph_module)
    except Exception as e:  # noqa: BLE001 - reported, the other forms still run
        print(f"{name}: export failed: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
    try:
        forms["training"] = traced_training(model, inputs)
    except Exception as e:  # noqa: BLE001
        print(f"{name}: training trace failed: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
    return forms


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", help="only these (names as listed in the output)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    from models import zoo

    models = [(f"zoo.{n}", m, i) for n, m, i in zoo()] + torchvision_models() + hugging_face_models()
    if args.models:
        models = [m for m in models if m[0] in args.models]
    ops: dict = {}
    for name, model, inputs in models:
        print(f"[trace] {name}", file=sys.stderr)
        for form, found in trace(name, model, inputs).items():
            for op in found:
                ops.setdefault(op, {}).setdefault(form, []).append(name)
    record = {"torch": torch.__version__.split("+")[0], "models": [m[0] for m in models],
              "ops": {op: {form: sorted(names) for form, names in sorted(forms.items())}
                      for op, forms in sorted(ops.items())}}
    with open(OUT, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    print(f"wrote {os.path.relpath(OUT, ROOT)}: {len(ops)} ops from {len(models)} models", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
