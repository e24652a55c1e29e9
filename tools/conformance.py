#!/usr/bin/env python3
"""PyTorch's OpInfo database through torch.compile(backend="tpuc") in strict mode, or on the
tpuc device in strict or fused eager mode (`--mode`).

For each OpInfo op and each dtype it defines among float32, bfloat16, float16, int64, int32 and
bool: its first sample inputs (drawn from a fixed seed, so runs are comparable) are compiled with
tpuc (no eager fallback), or moved to the tpuc device and the op run there (TPUC_STRICT=1: no CPU fallback; in fused mode the op's run is
compiled when its results are read back), and the results are compared with eager torch using
torch.testing.assert_close's default tolerances for the dtype (the tolerances OpInfo's tests use
unless a test overrides them).

Each (op, dtype) sample set is
  passed       every sample matches eager (indices of sorting-like ops may order equal
               elements differently: they must pick the same values),
  failed       a sample differs or tpuc's compiled code errs (reason given),
  not reached  a sample's graph contains an op tpuc does not lower (strict mode refuses it), or
               a lowering refuses an argument or dtype it does not handle (a clear error),
  harness error  eager torch itself raises on the sample, or the samples cannot be made: the
               harness is broken (OpInfo's samples are valid inputs), never a skip,
  skipped      no op reached tpuc (Dynamo ran it, or it is a view of an input that aot_autograd
               makes itself), the graph draws random numbers (docs/random.md), eager
               returns uninitialized memory, or the OpInfo is CUDA-only (jiterator).
The pass rate is passed / every set that is not skipped: failed, not reached and harness errors
count against it.

usage: .venv/bin/python tools/conformance.py [--subset ci | --ops NAME ...] [--dtypes ...]
                                             [--samples N] [--mode compiled|strict|fused] [--write]
  --write  writes docs/conformance.md and docs/conformance.json (compiled), or
           docs/conformance-<mode>.md (the eager modes); the full run writes these, a run of
           --ops replaces those ops' sets in them.
"""
import argparse
import json
import os
import re
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import torch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DTYPES = {
    "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
    "int64": torch.int64, "int32": torch.int32, "bool": torch.bool,
}
# A documented subset for CI (float32 and int64, first sample): common ops of each family.
CI_OPS = [
    "abs", "add", "addmm", "amax", "argmax", "bmm", "cat", "clamp", "cos", "cumsum", "div",
    "eq", "exp", "fft.irfft", "fft.rfft", "flip", "floor_divide", "fmod", "gather", "index_select",
    "log", "log_softmax", "logical_and", "lt", "matmul", "max_pool2d_with_indices_backward",
    "maximum", "mean", "minimum", "mm", "mul", "neg", "nn.functional.conv2d", "nn.functional.gelu",
    "nn.functional.layer_norm", "nn.functional.linear", "nn.functional.relu", "permute", "pow",
    "remainder", "reshape", "rsqrt", "scatter_add", "sigmoid", "sin", "softmax", "sort", "sqrt",
    "stack", "sub", "sum", "tanh", "topk", "transpose", "tril", "where",
    # One of each op family reached later: special functions, shifts, integer and float edges,
    # scans with indices.
    "polygamma", "special.zeta", "special.i1e", "nextafter", "hypot", "frexp", "bitwise_left_shift",
    "gcd", "dist", "cummax", "logcumsumexp", "round", "special.i0e", "special.erfcx", "special.ndtri",
    "mode", "put", "histc", "nn.functional.adaptive_max_pool2d", "nn.functional.bilinear",
    "special.bessel_j0", "special.bessel_j1", "special.bessel_y0", "special.bessel_y1",
    "special.modified_bessel_k0", "special.modified_bessel_k1", "special.scaled_modified_bessel_k0",
    "special.scaled_modified_bessel_k1", "special.airy_ai", "special.chebyshev_polynomial_t",
    "special.chebyshev_polynomial_u", "special.chebyshev_polynomial_v", "special.chebyshev_polynomial_w",
    "special.shifted_chebyshev_polynomial_t", "special.shifted_chebyshev_polynomial_u",
    "special.shifted_chebyshev_polynomial_v", "special.shifted_chebyshev_polynomial_w",
    "igamma", "igammac", "special.hermite_polynomial_h", "special.hermite_polynomial_he",
    "special.laguerre_polynomial_l", "special.legendre_polynomial_p",
    # Linear algebra (float32).
    "linalg.solve", "linalg.det", "linalg.slogdet", "linalg.inv", "linalg.cholesky", "linalg.eigh",
    "linalg.svd", "linalg.qr", "linalg.lu_factor", "linalg.solve_triangular", "linalg.pinv",
    "linalg.polar", "linalg.matrix_sqrth",
    # Kept whole where torch's decompositions would round 16-bit floats another way.
    "linalg.cross", "logit", "addr", "addcmul", "addbmm",
]
CI_DTYPES = ["float32", "int64"]


def leaves(value):
    return [t for t in torch.utils._pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]


class Recorder:
    """The ATen ops tpuc is given while a sample runs: the ops of the graphs it compiles
    (compiled mode), or the ops called on the tpuc device (its modes: `on_device` records them
    with `seen`, as a dispatch mode, since an op planned before runs without Python)."""

    def __init__(self):
        import tpuc.compiler as compiler
        from tpuc.graph import op_name

        self.ops = set()
        original = compiler.GraphCompiler.compile_whole

        def compile_whole(compiler, gm, name, *rest):
            self.ops.update(op_name(n) for n in gm.graph.nodes if n.op == "call_function")
            return original(compiler, gm, name, *rest)

        compiler.GraphCompiler.compile_whole = compile_whole

    def seen(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        ops = self.ops

        class Seen(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                ops.add(str(func))
                return func(*args, **(kwargs or {}))

        return Seen()


# OpInfos whose arguments after the first PyTorch requires on the CPU, whatever the device.
CPU_ARGUMENTS = {"tensor_split"}


def on_device(opinfo, sample):
    """The op run on the tpuc device on the sample moved there, its results back on the CPU."""
    def move(value, where):
        if isinstance(value, torch.Tensor):
            if value.layout != torch.strided:
                raise NotImplementedError(f"{value.layout} tensors are not supported on the tpuc device")
            return value.to(where) if where == "tpuc" or value.device.type == "tpuc" else value
        if isinstance(value, (list, tuple)):
            return type(value)(move(v, where) for v in value)
        if isinstance(value, dict):
            return {k: move(v, where) for k, v in value.items()}
        return value

    rest = "cpu" if opinfo.name in CPU_ARGUMENTS else "tpuc"
    result = opinfo.op(move(sample.input, "tpuc"), *move(list(sample.args), rest),
                       **move(dict(sample.kwargs), rest))
    return move(result, "cpu")


# OpInfos whose eager results are uninitialized memory: nothing to compare.
UNINITIALIZED = {"empty", "new_empty", "empty_like", "empty_strided", "new_empty_strided", "empty_permuted"}
# OpInfos returning indices whose order among equal elements torch leaves unspecified.
TIES = {"sort", "argsort", "topk", "kthvalue", "mode", "median", "nanmedian", "msort", "max", "min",
        "max.reduction_with_dim", "min.reduction_with_dim", "argmax", "argmin"}

# OpInfos returning eigenvectors or singular vectors, each defined up to its sign (LAPACK and
# XLA's Jacobi solver may choose either).
SIGNS = {"linalg.eigh", "linalg.svd", "svd"}

# ATen ops whose values are random draws.
# (In-place forms, `uniform_`, count as theirs.)
RANDOM_OPS = {"rand", "randn", "rand_like", "randn_like", "randint", "randint_like", "randperm",
              "bernoulli", "native_dropout", "uniform", "normal", "normal_functional", "exponential",
              "multinomial", "poisson", "geometric", "log_normal", "cauchy", "rrelu_with_noise",
              "rrelu_with_noise_functional"}
# OpInfos that read the storage beyond their input's own elements: moving a view that does not
# cover its storage to another device copies only its elements (on CUDA as on tpuc), so the
# device modes cannot compare such samples.
STORAGE_OPS = {"as_strided", "as_strided_scatter", "as_strided_copy"}


def _partial_view(tensor) -> bool:
    """Whether `tensor` holds fewer elements than its storage (a view of part of it)."""
    return isinstance(tensor, torch.Tensor) and tensor.untyped_storage().nbytes() > tensor.numel() * tensor.element_size()


def run_sample(opinfo, sample, recorder, mode="compiled"):
    """'passed', ('failed', why), ('not reached', why), ('harness error', why) or ('skipped', why)."""
    def call(*_):
        return opinfo.op(sample.input, *sample.args, **sample.kwargs)

    if mode != "compiled" and opinfo.name in STORAGE_OPS and _partial_view(sample.input):
        return ("skipped", "reads storage outside its input view, which a move to the device does not carry")
    try:
        expected = call()
    except Exception as e:  # OpInfo's samples are valid: eager failing is the harness's fault
        return ("harness error", f"eager: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}")
    recorder.ops.clear()
    if mode == "compiled":
        torch._dynamo.reset()
        # Results are copied inside the compiled function: a result that is a view of an input
        # would otherwise be made again by aot_autograd from the input, never by tpuc.
        copied = lambda *_: torch.utils._pytree.tree_map(  # noqa: E731
            lambda v: v.clone() if isinstance(v, torch.Tensor) else v, call())
        run = torch.compile(copied, backend="tpuc", options={"strict": True}, fullgraph=False)
    else:
        def run():
            with recorder.seen():
                return on_device(opinfo, sample)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            actual = run()
    except Exception as e:
        message = str(e)
        if "cannot lower these ops" in message:
            # The report lists "  <op> xN[ (first at ...)]", one op per line.
            ops = [m.group(1) for m in map(re.compile(r"^\s+(\S+) x\d+").match, message.splitlines()) if m]
            return ("not reached", ", ".join(ops) or message.splitlines()[-1][:120])
        if "cannot run on the tpuc device" in message:
            # The device's error under TPUC_STRICT=1: "<op> cannot run on the tpuc device: <why> ...".
            return ("not reached", message.split(" (TPUC_STRICT=1)")[0][:160])
        if "not supported" in message or "unsupported dtype" in message:
            # A lowering refusing an argument (or dtype) it does not handle, by design.
            line = next((text for text in message.splitlines() if "not supported" in text or "unsupported dtype" in text), message)
            return ("not reached", line.strip()[:200])
        first = next((line for line in message.splitlines() if "Error" in line or "not supported" in line),
                     message.splitlines()[0] if message else type(e).__name__)
        return ("failed", first.strip()[:200])
    # The copies the harness adds in compiled mode are not the op reaching tpuc.
    reached = recorder.ops - ({"aten.clone.default"} if opinfo.name != "clone" else set())
    if not reached and mode == "compiled":
        return ("skipped", "no op reached tpuc (Dynamo ran it eagerly, or aot_autograd makes it as a view of an input)")
    random = sorted(op for op in recorder.ops
                    if op.startswith("aten.") and op.split(".")[1].rstrip("_") in RANDOM_OPS)
    if random:
        # tpuc's random numbers are not torch's (docs/random.md); tests/test_random.py checks
        # their distributions instead.
        return ("skipped", f"random ({', '.join(random)}): checked by distribution, not value")
    if opinfo.name in UNINITIALIZED:
        return ("skipped", "eager's result is uninitialized memory")
    try:
        torch.testing.assert_close(actual, expected, equal_nan=True)
    except Exception as e:
        if opinfo.name in TIES and equal_up_to_ties(actual, expected, sample.input):
            return "passed"
        if opinfo.name in SIGNS and equal_up_to_signs(actual, expected):
            return "passed"
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        why = cause(actual, expected, opinfo.name, lambda: wider_reference(opinfo, sample, expected))
        return ("failed", why + "; ".join(lines[:3])[:200])
    return "passed"


def equal_up_to_signs(actual, expected):
    """Whether each result matches with its vectors (the columns, or the rows) flipped in sign
    where tpuc's point the other way."""
    for a, e in zip(leaves(actual), leaves(expected)):
        if a.shape != e.shape:
            return False
        candidates = [a]
        if a.dim() >= 2 and a.is_floating_point():
            candidates = [a * torch.sign((a * e).sum(-2, keepdim=True)), a * torch.sign((a * e).sum(-1, keepdim=True))]
        if not any(close(c, e) for c in candidates):
            return False
    return True


def close(actual, expected):
    """assert_close's verdict with its default tolerances for the dtype."""
    try:
        torch.testing.assert_close(actual, expected, equal_nan=True)
        return True
    except AssertionError:
        return False


# Machine epsilon of the 16-bit float types: one unit in the last place relative to 1.
EPSILON = {torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}
# The type a reference computation uses for inputs of each float type.
WIDER = {torch.float16: torch.float32, torch.bfloat16: torch.float32, torch.float32: torch.float64}


def wider_reference(opinfo, sample, expected):
    """The op computed by eager torch from the same inputs widened (16-bit floats to float32,
    float32 to float64), each output rounded once to eager's dtype; None when that cannot be
    computed."""
    def widen(value):
        if isinstance(value, torch.Tensor) and value.dtype in WIDER:
            return value.to(WIDER[value.dtype])
        if isinstance(value, (tuple, list)):
            return type(value)(widen(v) for v in value)
        return value

    try:
        wide = opinfo.op(widen(sample.input), *widen(list(sample.args)),
                         **{k: widen(v) for k, v in sample.kwargs.items()})
        return [w.to(e.dtype) for w, e in zip(leaves(wide), leaves(expected), strict=True)]
    except Exception:
        return None


def cause(actual, expected, op, reference):
    """Why a sample differs, where the script can tell: a result that equals the op computed in
    a wider type and rounded once (eager's kernel rounds intermediate results: tpuc is the more
    accurate), a 16-bit result within a few units in the last place of eager's (the two round
    intermediates in different places), or index outputs that differ on ties."""
    actual, expected = leaves(actual), leaves(expected)
    if op in TIES and all(a.dtype == torch.int64 for a in actual if not a.is_floating_point()):
        return "cause: equal elements ranked in another order (ties); "
    if len(actual) != len(expected) or not any(e.dtype in WIDER for e in expected):
        return ""
    wide = reference()
    if wide is not None:
        try:
            torch.testing.assert_close(actual, wide, equal_nan=True)
            wider = WIDER[next(e.dtype for e in expected if e.dtype in WIDER)]
            return (f"cause: eager's rounding of intermediates; tpuc matches the {str(wider)[6:]} "
                    "computation rounded once; ")
        except Exception:
            pass
    if not any(e.dtype in EPSILON for e in expected):
        return ""
    try:
        for a, e in zip(actual, expected):
            # 16-bit outputs within 4 units in the last place; others at their usual tolerance.
            ulps = 4 * EPSILON[e.dtype] if e.dtype in EPSILON else None
            torch.testing.assert_close(a, e, rtol=ulps, atol=ulps, equal_nan=True)
        return "cause: 16-bit rounding, within 4 ulp of eager; "
    except Exception:
        return ""


def equal_up_to_ties(actual, expected, source):
    """Whether index outputs that differ from eager's pick equal elements of `source` (ties
    in another order), with every other output equal."""
    actual = list(actual) if isinstance(actual, (tuple, list)) else [actual]
    expected = list(expected) if isinstance(expected, (tuple, list)) else [expected]
    if not isinstance(source, torch.Tensor) or len(actual) != len(expected):
        return False
    for a, e in zip(actual, expected):
        if a.dtype != torch.int64 or a.shape != e.shape or source.dim() == 0 or a.dim() < source.dim() - 1:
            if not torch.equal(a, e) and not (a.is_floating_point() and torch.allclose(a, e, equal_nan=True)):
                return False
            continue
        if torch.equal(a, e):
            continue
        def picked(dim, index):
            if index.dim() == source.dim() - 1:  # a reduced dimension (keepdim=False)
                index = index.unsqueeze(dim)
            try:
                return source.gather(dim, index)
            except (RuntimeError, IndexError):
                return None
        if not any((x := picked(d, a)) is not None and (y := picked(d, e)) is not None
                   and torch.equal(torch.nan_to_num(x), torch.nan_to_num(y))
                   for d in range(source.dim())):
            return False
    return True


MODES = ("compiled", "strict", "fused")


def run(op_names, dtype_names, samples, mode="compiled"):
    from torch.testing._internal.common_methods_invocations import op_db

    if mode not in MODES:
        raise SystemExit(f"conformance: mode must be one of {MODES}, not {mode!r}")
    import tpuc.device

    tpuc.device.fused(mode == "fused")
    # On the device, an op tpuc cannot lower is an error, not a CPU fallback.
    strict = os.environ.get("TPUC_STRICT")
    os.environ["TPUC_STRICT"] = "1"
    try:
        return _run(op_db, op_names, dtype_names, samples, mode)
    finally:
        tpuc.device.fused(False)
        if strict is None:
            del os.environ["TPUC_STRICT"]
        else:
            os.environ["TPUC_STRICT"] = strict


_RECORDER = []  # one per process: it wraps the compilers' entry points


def _run(op_db, op_names, dtype_names, samples, mode):
    from torch.testing._internal.common_utils import set_rng_seed

    if not _RECORDER:
        _RECORDER.append(Recorder())
    recorder = _RECORDER[0]
    wanted = set(op_names) if op_names else None
    results = []
    for opinfo in op_db:
        if wanted is not None and opinfo.name not in wanted:
            continue
        supported = opinfo.supported_dtypes("cpu")
        for dtype_name in dtype_names:
            dtype = DTYPES[dtype_name]
            if dtype not in supported:
                continue
            if opinfo.name.startswith("jiterator_"):
                # Jiterator OpInfos compile CUDA kernels at run time: nothing runs on the CPU.
                results.append({"op": opinfo.name, "dtype": dtype_name, "status": "skipped",
                                "reason": "CUDA-only (jiterator)", "aten": []})
                continue
            status, reasons, ops = "skipped", [], set()
            # Each set's samples come from the same seed, as in OpInfo's tests (which seed every
            # test): a set's result does not depend on which sets ran before it.
            set_rng_seed()
            try:
                sample_list = list(opinfo.sample_inputs("cpu", dtype, requires_grad=False))[:samples]
            except Exception as e:
                results.append({"op": opinfo.name, "dtype": dtype_name, "status": "harness error",
                                "reason": f"samples: {type(e).__name__}", "aten": []})
                continue
            outcomes = []
            for sample in sample_list:
                outcome = run_sample(opinfo, sample, recorder, mode)
                outcomes.append(outcome)
                ops |= recorder.ops
            kinds = [o if isinstance(o, str) else o[0] for o in outcomes]
            for kind in STATUSES:
                if kind in kinds:
                    status = kind
                    break
            reasons = sorted({o[1] for o in outcomes if not isinstance(o, str) and o[0] == status})
            results.append({"op": opinfo.name, "dtype": dtype_name, "status": status,
                            "reason": "; ".join(reasons)[:300], "aten": sorted(ops)})
    return results


# A set's status is the worst of its samples', in this order.
STATUSES = ("harness error", "failed", "not reached", "passed", "skipped")


def summary(results):
    counts = {k: sum(1 for r in results if r["status"] == k) for k in STATUSES}
    judged = len(results) - counts["skipped"]
    rate = counts["passed"] / judged if judged else 1.0
    return counts, rate


def record_path(mode: str) -> str:
    """The recorded full run of a mode, which the CI subset must not fall behind."""
    name = "conformance.json" if mode == "compiled" else f"conformance-{mode}.json"
    return os.path.join(ROOT, "docs", name)


def recorded(mode: str) -> dict:
    """(op, dtype) -> status of the recorded full run of `mode` (empty when there is none)."""
    try:
        with open(record_path(mode)) as f:
            return {(r["op"], r["dtype"]): r["status"] for r in json.load(f)["results"]}
    except FileNotFoundError:
        return {}


# Why each op that leaves sets not reached stays so (matched against the reason recorded), for
# docs/conformance.md: what XLA or a static-shape program lacks, or what is not written yet.
NOT_REACHED_BECAUSE = [
    ("complex32", "complex32 (complex halves): XLA has no such type"),
    ("aten.linalg_eig", "the general eigendecomposition has complex results; XLA's CPU backend has no "
                        "expander for it (symmetric matrices: linalg.eigh)"),
    ("aten.linalg_ldl", "Bunch-Kaufman LDL^T (pivoting by magnitude comparisons step by step): not written yet"),
    ("aten.linalg_matrix_exp", "the Pade degree and the number of squarings follow the matrix's norm "
                               "(data): not written yet"),
    ("aten.segment_reduce", "segments of data-given lengths: not written yet"),
    ("aten.hash_tensor", "a hash of the tensor's bytes: not written yet"),
    ("aten.histogram", "bin edges from data (histogram, histogramdd): not written yet"),
    ("aten._histogramdd", "bin edges from data (histogram, histogramdd): not written yet"),
    ("as_strided of storage position", "reads storage outside the elements its input holds (a partial "
                                       "view): a compiled program has only the input's own elements, so "
                                       "tpuc refuses rather than read wrongly"),
    ("aten.as_strided_scatter", "a scatter through a strided view of a storage tpuc does not model"),
    ("aten.grid_sampler_3d", "3-d grid sampling: not written yet (2-d is)"),
    ("aten._upsample_bilinear2d_aa", "antialiased resampling: not written yet"),
    ("torch_nn.", "a custom op of torch's own (torch.library), opaque to every backend: its ATen "
                  "decomposition is torch's Python code, which tpuc does not trace yet"),
]


def not_reached_because(reason: str) -> str | None:
    for key, why in NOT_REACHED_BECAUSE:
        if key in reason:
            return why
    return None


def write(results, seconds, args):
    """docs/conformance.md and .json (the compile backend), or docs/conformance-<mode>.md (the
    device's eager modes: the sets that did not pass, beside the compile backend's report)."""
    counts, rate = summary(results)
    compiled = args.mode == "compiled"
    record = {"results": results}
    if compiled:
        passed_dtypes = {}
        for r in results:
            if r["status"] == "passed":
                for op in r["aten"]:
                    passed_dtypes.setdefault(op, set()).add(r["dtype"])
        record = {"passed_dtypes_by_op": {k: sorted(v) for k, v in sorted(passed_dtypes.items())}, **record}
    with open(record_path(args.mode), "w") as f:
        json.dump(record, f, indent=0)
    title = "# OpInfo conformance" if compiled else f"# OpInfo conformance on the tpuc device, {args.mode} eager mode"
    command = "tools/conformance.py --write" if compiled else f"tools/conformance.py --mode {args.mode} --write"
    peer = "" if compiled else " The compile backend's: [conformance.md](conformance.md); listed here: the sets that did not pass."
    lines = [
        title,
        "",
        f"Generated by `{command}` (torch {torch.__version__.split('+')[0]}, "
        f"{args.samples} sample(s) per op and dtype, {seconds / 60:.0f} min).{peer}",
        "",
        f"{len(results)} (op, dtype) sample sets: {counts['passed']} passed, {counts['failed']} failed, "
        f"{counts['not reached']} not reached (an op tpuc does not lower), {counts['harness error']} harness "
        f"errors, {counts['skipped']} skipped. Pass rate (passed / every set not skipped): {rate:.1%}.",
        "",
        "Where tpuc on the CPU plugin differs from eager torch by design: XLA's CPU runtime flushes "
        "subnormal floats to zero (a result that is or reads a subnormal is zero; bit-level ops such as "
        "nextafter and view(dtype) are exact); eigenvectors and singular vectors are compared up to the "
        "sign of each vector (LAPACK and XLA's Jacobi solver may pick either); torch.linalg's errors for "
        "singular or indefinite matrices are raised by the backend after the compiled call, while a "
        "program run by `tpuc run` returns the inf or NaN the factorisation gives. Each not-reached op's "
        "reason says why it stays so.",
        "",
        "| op | dtype | status | reason |",
        "|---|---|---|---|",
    ]
    for r in results:
        if compiled or r["status"] in ("failed", "not reached", "harness error"):
            reason = r["reason"]
            why = not_reached_because(reason) if r["status"] == "not reached" else None
            if why:
                reason = f"{reason} (why: {why})"
            reason = reason.replace("|", "\\|")
            lines.append(f"| `{r['op']}` | {r['dtype']} | {r['status']} | {reason} |")
    name = "conformance.md" if compiled else f"conformance-{args.mode}.md"
    with open(os.path.join(ROOT, "docs", name), "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--subset", choices=["ci"])
    parser.add_argument("--ops", nargs="+")
    parser.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=list(DTYPES))
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--mode", choices=MODES, default="compiled")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    ops, dtypes = args.ops, args.dtypes
    if args.subset == "ci":
        ops, dtypes, args.samples = CI_OPS, CI_DTYPES, 1
    start = time.time()
    results = run(ops, dtypes, args.samples, args.mode)
    seconds = time.time() - start
    counts, rate = summary(results)
    for r in results:
        if r["status"] in ("failed", "not reached", "harness error"):
            print(f"{r['status']:<13} {r['op']} {r['dtype']}: {r['reason']}")
    print(f"{counts} pass rate {rate:.1%} in {seconds:.0f} s")
    if args.write:
        if ops is not None:
            # The listed ops rerun: their sets replace the recorded full run's, the rest kept.
            results, seconds = merged(results, args.mode), recorded_seconds(args.mode)
        write(results, seconds, args)
    return counts, rate


def merged(results: list, mode: str) -> list:
    """The recorded full run of `mode` with the sets of `results` in place of its own (new ones
    after the rest)."""
    with open(record_path(mode)) as f:
        recorded = json.load(f)["results"]
    fresh = {(r["op"], r["dtype"]): r for r in results}
    kept = [fresh.pop((r["op"], r["dtype"]), r) for r in recorded]
    return kept + list(fresh.values())


def recorded_seconds(mode: str) -> float:
    """How long the recorded full run of `mode` took, as its report says."""
    name = "conformance.md" if mode == "compiled" else f"conformance-{mode}.md"
    with open(os.path.join(ROOT, "docs", name)) as f:
        found = re.search(r"per op and dtype, (\d+) min\)", f.read())
    return 60.0 * int(found[1]) if found else 0.0


if __name__ == "__main__":
    main()
