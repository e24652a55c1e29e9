#!/usr/bin/env python3
"""Decode benchmark: tiny Llama, Qwen2 and Mistral configurations (random weights) generating
64 tokens greedily from an 8-token prompt with Hugging Face `generate`, with the dynamic and the
static cache, for eager torch, inductor and tpuc (`model.forward = torch.compile(model.forward,
backend=...)`), and eager on the tpuc device (`device`: strict mode, `device-fused`: fused mode;
the model and prompt moved with `.to("tpuc")`, its compiles are the ops it planned). For each:
the time of the first `generate` with an empty compile cache on disk and with the one the first
filled, of the second `generate` (and what it compiled), the steady time per token, and whether
the tokens equal eager's. Each measurement runs in a process of its
own; run on an idle machine.

Usage: .venv/bin/python tools/bench_decode.py [--models llama,qwen2,mistral] [--caches dynamic,static]
       [--systems eager,inductor,tpuc,device,device-fused] [--new-tokens 64] [--json FILE]
Needs `transformers` (tools/setup.sh installs it).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

PROMPT = 8


def build(name: str):
    """A tiny model of the family `name`, random weights from a fixed seed."""
    import torch
    import transformers as hf

    shape = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    config, model = {
        "llama": (hf.LlamaConfig, hf.LlamaForCausalLM),
        "qwen2": (hf.Qwen2Config, hf.Qwen2ForCausalLM),
        "mistral": (hf.MistralConfig, hf.MistralForCausalLM),
    }[name]
    torch.manual_seed(0)
    return model(config(**shape)).eval()


def worker(name: str, cache: str, system: str, new_tokens: int) -> dict:
    """One measurement, in this process: prints its figures as JSON."""
    import torch

    model = build(name)
    stats, counter = None, "compiles"  # tpuc's counters
    torch.manual_seed(1)
    prompt = torch.randint(0, 256, (1, PROMPT))
    if system.startswith("device"):
        import tpuc.device
        from tpuc.planner import STATS as stats
        counter = "plans"
        tpuc.device.fused(system == "device-fused")
        model, prompt = model.to("tpuc"), prompt.to("tpuc")
    elif system != "eager":
        model.forward = torch.compile(model.forward, backend=system)
    if system == "tpuc":
        from tpuc.runtime import STATS as stats
    kwargs = dict(max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    if cache == "static":
        kwargs["cache_implementation"] = "static"

    def generate():
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(prompt, **kwargs)
        return time.perf_counter() - start, out[0, PROMPT:].tolist()

    first, tokens = generate()
    before = None if stats is None else stats[counter]
    second, again = generate()
    compiled_second = None if stats is None else stats[counter] - before
    steady = min(generate()[0] for _ in range(3))
    return {"model": name, "cache": cache, "system": system, "first": first, "second": second,
            "steady_per_token": steady / new_tokens, "tokens": tokens, "same_twice": tokens == again,
            "compiled_second": compiled_second}


def run(name, cache, system, new_tokens, cache_dir) -> dict:
    env = dict(os.environ, TPUC_CACHE_DIR=os.path.join(cache_dir, "tpuc"),
               TORCHINDUCTOR_CACHE_DIR=os.path.join(cache_dir, "inductor"), TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run([sys.executable, __file__, "--worker", name, cache, system, str(new_tokens)],
                         capture_output=True, text=True, env=env, timeout=1800)
    if out.returncode != 0:
        return {"model": name, "cache": cache, "system": system, "error": out.stderr.strip().splitlines()[-1:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="llama,qwen2,mistral")
    parser.add_argument("--caches", default="dynamic,static")
    parser.add_argument("--systems", default="eager,inductor,tpuc")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--json", help="also write every figure to this file")
    parser.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        name, cache, system, new_tokens = args.worker
        print(json.dumps(worker(name, cache, system, int(new_tokens))))
        return
    rows = []
    print(f"{'model':8} {'cache':8} {'system':9} {'first(empty)':>12} {'first(filled)':>13} {'second':>8} "
          f"{'ms/token':>9} {'compiles':>8}  tokens")
    for name in args.models.split(","):
        for cache in args.caches.split(","):
            eager_tokens = None
            for system in args.systems.split(","):
                with tempfile.TemporaryDirectory(prefix="tpuc-bench-decode-") as cache_dir:
                    empty = run(name, cache, system, args.new_tokens, cache_dir)
                    filled = run(name, cache, system, args.new_tokens, cache_dir) if system != "eager" else empty
                rows.append({"empty": empty, "filled": filled})
                if "error" in empty or "error" in filled:
                    print(f"{name:8} {cache:8} {system:9} failed: {(empty.get('error') or filled.get('error'))}")
                    continue
                if system == "eager":
                    eager_tokens = empty["tokens"]
                same = "same as eager" if empty["tokens"] == eager_tokens else "DIFFER from eager"
                compiles = "-" if empty["compiled_second"] is None else str(empty["compiled_second"])
                print(f"{name:8} {cache:8} {system:9} {empty['first']:12.2f} {filled['first']:13.2f} "
                      f"{empty['second']:8.3f} {1000 * empty['steady_per_token']:9.2f} {compiles:>8}  {same}",
                      flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
