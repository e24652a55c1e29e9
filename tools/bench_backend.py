#!/usr/bin/env python3
"""torch.compile backends compared on this machine: eager, inductor and tpuc.

For each thread count (the process is pinned to that many cores and torch uses that many
threads) and each model:
- first call (compile included): each backend in a fresh process, cold (empty on-disk caches:
  inductor's and tpuc's compiled-code caches in a new directory) and warm (a second process with
  the caches the first one filled: what a user sees when running a script again);
- steady-state latency: all backends compiled in one process and timed in interleaved rounds
  (each round times a block of calls of every backend, in rotating order), so a slow spell of
  this shared machine lands on all backends alike. Reported: the median over rounds of each
  round's median call, and the medians over rounds of each round's ratios to eager and to
  inductor. With --repeat N, that process runs N times and the rounds of all runs are pooled;
  the range of the runs' own ratios to inductor is printed too (this machine's speed drifts by
  tens of percent over minutes, more with two threads).
Models: a tiny graph (per-call overhead), a Llama block (batch 1, seq 128, hidden 256, fp32) and
ResNet-18 (batch 1, 3x224x224); on request the Llama block's pieces alone: linear (256 -> 688),
swiglu, rmsnorm, attention (projections, RoPE, GQA, causal SDPA) and sdpa (8 heads x 128 x 32).
Inference under torch.no_grad. Run on an idle machine: tools/bench_backend.sh.

usage: bench_backend.py [--threads 1 2] [--models tiny llama_block resnet18 | linear swiglu
                        rmsnorm attention sdpa] [--backends eager inductor tpuc tpuc-kernels]
                        [--rounds 15] [--repeat 1] [--steady-only] [--json OUT]
(`tpuc-patterns`, `tpuc-kernels`: tpuc with that fusion choice.)
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

MODELS = ("tiny", "llama_block", "resnet18")
# The Llama block's pieces, on request.
PIECES = ("linear", "swiglu", "rmsnorm", "attention", "sdpa")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "crates", "tpuc-python", "tests"))


def build(name):
    import torch

    torch.manual_seed(0)
    if name == "tiny":
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
        return model.eval(), (torch.randn(1, 8),)
    if name == "llama_block":
        from models import DecoderBlock

        return DecoderBlock(256, heads=8, kv_heads=4, hidden=688).eval(), (torch.randn(1, 128, 256),)
    if name == "resnet18":
        from models import resnet18

        return resnet18().eval(), (torch.randn(1, 3, 224, 224),)
    # The Llama block's pieces, to see where a difference comes from.
    x = torch.randn(1, 128, 256)
    if name == "linear":
        return torch.nn.Linear(256, 688, bias=False).eval(), (x,)
    if name == "swiglu":
        from models import SwiGLU

        return SwiGLU(256, 688).eval(), (x,)
    if name == "rmsnorm":
        from models import RMSNorm

        return RMSNorm(256).eval(), (x,)
    if name == "attention":
        from models import Attention

        return Attention(256, 8, 4).eval(), (x,)
    if name == "sdpa":

        class CausalAttention(torch.nn.Module):
            def forward(self, q, k, v):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

        return CausalAttention().eval(), tuple(torch.randn(1, 8, 128, 32) for _ in range(3))
    raise ValueError(name)


def compiled(model_name, backend):
    """The model under `backend`: eager, a torch.compile backend, or `tpuc-<fusion>` (tpuc with
    that fusion choice: `tpuc-kernels`)."""
    import torch

    model, inputs = build(model_name)
    if backend == "eager":
        return model, inputs
    if backend.startswith("tpuc-"):
        return torch.compile(model, backend="tpuc", options={"fusion": backend.removeprefix("tpuc-")}), inputs
    return torch.compile(model, backend=backend), inputs


def first_call(model_name, backend):
    """Seconds of the first call (compile included) in this fresh process."""
    import torch

    fn, inputs = compiled(model_name, backend)
    with torch.no_grad():
        start = time.perf_counter()
        fn(*inputs)
    return time.perf_counter() - start


def steady(model_name, backends, rounds):
    """Per backend: median over interleaved rounds of the round's median call (seconds), and the
    per-round medians (for ratios within a round)."""
    import torch

    fns = {b: compiled(model_name, b) for b in backends}
    with torch.no_grad():
        for fn, inputs in fns.values():
            for _ in range(10):
                fn(*inputs)
        # Blocks of about 0.2 s of calls per backend and round, at least 10 calls.
        counts = {}
        for b, (fn, inputs) in fns.items():
            start = time.perf_counter()
            fn(*inputs)
            counts[b] = max(10, min(1000, int(0.2 / max(time.perf_counter() - start, 1e-6))))
        per_round = {b: [] for b in backends}
        for r in range(rounds):
            order = backends[r % len(backends):] + backends[:r % len(backends)]
            for b in order:
                fn, inputs = fns[b]
                times = []
                for _ in range(counts[b]):
                    start = time.perf_counter()
                    fn(*inputs)
                    times.append(time.perf_counter() - start)
                per_round[b].append(statistics.median(times))
    return {b: summary(v, counts[b]) for b, v in per_round.items()}


def summary(per_round_s, calls_per_round):
    return {
        "steady_s": statistics.median(per_round_s),
        "per_round_s": per_round_s,
        "calls_per_round": calls_per_round,
    }


def pooled(runs):
    """The steady-state results of several processes as one, their rounds pooled."""
    return {
        b: summary([t for run in runs for t in run[b]["per_round_s"]], runs[0][b]["calls_per_round"])
        for b in runs[0]
    }


def ratio(timed, backend, base):
    """Median over rounds of the backend's steady time over the base's in the same round."""
    return statistics.median(
        x / y for x, y in zip(timed[backend]["per_round_s"], timed[base]["per_round_s"])
    )


def child(args):
    os.sched_setaffinity(0, set(range(args.threads_one)))
    import torch

    torch.set_num_threads(args.threads_one)
    if args.backend:
        print(json.dumps({"first_call_s": first_call(args.model, args.backend)}))
    else:
        print(json.dumps(steady(args.model, args.backends, args.rounds)))


def run_child(args, env, *extra):
    out = subprocess.run(
        [sys.executable, __file__, "--child", *extra, "--rounds", str(args.rounds)],
        capture_output=True, text=True, env=env,
    )
    if out.returncode != 0:
        raise RuntimeError(failure(out.stderr, out.returncode))
    return json.loads(out.stdout.strip().splitlines()[-1])


def first_calls(args, env, common, backend):
    """Seconds of `backend`'s first call in a process with empty compiled-code caches, then in a
    second process with the caches the first one left."""
    with tempfile.TemporaryDirectory(prefix="bench-caches-") as caches:
        env = dict(env, TORCHINDUCTOR_CACHE_DIR=os.path.join(caches, "inductor"),
                   TPUC_CACHE_DIR=os.path.join(caches, "tpuc"))
        return tuple(run_child(args, env, *common, "--backend", backend)["first_call_s"] for _ in range(2))


def failure(stderr: str, returncode: int) -> str:
    """The line of a child's stderr that says what failed: the last exception raised (torch's
    errors end with lines of advice after it), else the last line."""
    lines = stderr.strip().splitlines()
    raised = [line for line in lines if re.match(r"^[\w.]+(Error|Exception|Interrupt)\b", line)]
    return (raised or lines or [f"exit status {returncode}"])[-1]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS + PIECES)
    parser.add_argument("--backends", nargs="+", default=["eager", "inductor", "tpuc"])
    parser.add_argument("--rounds", type=int, default=15,
                        help="interleaved rounds of steady-state timing (default 15)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="steady-state processes per model and thread count, rounds pooled "
                             "(default 1)")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--steady-only", action="store_true", dest="steady_only",
                        help="skip the first-call processes (steady-state latency only)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    parser.add_argument("--threads-one", type=int, dest="threads_one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    if args.backends[0] != "eager" and "eager" in args.backends:
        args.backends.remove("eager")
        args.backends.insert(0, "eager")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    results = []
    print(f"{'':>30}{'first call':^16}")
    print(f"{'threads':>7} {'model':<12} {'backend':<9} {'cold':>7} {'warm':>7} {'steady':>10}  "
          f"vs {args.backends[0]}" + ("  vs inductor" if "inductor" in args.backends else ""))
    for threads in args.threads:
        for model in args.models:
            common = ["--model", model, "--threads-one", str(threads)]
            try:
                runs = [run_child(args, env, *common, "--backends", *args.backends)
                        for _ in range(max(1, args.repeat))]
            except RuntimeError as e:
                print(f"{threads:>7} {model:<12} steady-state run FAILED: {e}")
                continue
            timed = pooled(runs)
            for backend in args.backends:
                try:
                    cold, warm = (float("nan"),) * 2 if args.steady_only else first_calls(args, env, common, backend)
                except RuntimeError as e:
                    print(f"{threads:>7} {model:<12} {backend:<9} first call FAILED: {e}")
                    continue
                r = dict(timed[backend], first_call_s=cold, first_call_warm_s=warm, threads=threads,
                         model=model, backend=backend, ratio=ratio(timed, backend, args.backends[0]))
                line = (f"{threads:>7} {model:<12} {backend:<9} {cold:>6.2f}s {warm:>6.2f}s "
                        f"{r['steady_s'] * 1e3:>8.3f}ms  {r['ratio']:.2f}x")
                if "inductor" in timed:
                    r["vs_inductor"] = ratio(timed, backend, "inductor")
                    line += f"     {r['vs_inductor']:.2f}x"
                    if len(runs) > 1:
                        per_run = [ratio(run, backend, "inductor") for run in runs]
                        r["vs_inductor_per_run"] = per_run
                        line += f" ({min(per_run):.2f}-{max(per_run):.2f} over {len(runs)} runs)"
                results.append(r)
                print(line, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
