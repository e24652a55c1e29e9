"""Checks each decomposition tpuc applies (torch's core-ATen table with tpuc's changes) against
torch's own kernel on the CPU, for every mix of input dtypes: a decomposition whose result has
another dtype, shape or value than the kernel's is a silent wrong result in every program that
reaches it. tpuc replaces those it finds (tpuc/decompositions.py).

    .venv/bin/python tools/audit_decompositions.py            # every op of the table
    .venv/bin/python tools/audit_decompositions.py aten.threshold_backward.default ...

Ops with up to three tensor arguments are tried with float32, float64, float16, int64 and bool
tensors (integers from 1, booleans all true: no integer division by zero) and 0.5 / 1 / False
for required numbers; a mix the kernel rejects is skipped. Losses are left out (their integer
reductions divide by counts) and so are ops whose result aliases an input.
"""
from __future__ import annotations

import itertools
import sys
import warnings

import torch

SAMPLES = {
    "float32": lambda: torch.randn(3, 4),
    "float64": lambda: torch.randn(3, 4, dtype=torch.float64),
    "float16": lambda: torch.randn(3, 4).half(),
    "int64": lambda: torch.randint(1, 4, (3, 4)),
    "bool": lambda: torch.ones(3, 4, dtype=torch.bool),
}
# Ops whose kernel's results are not defined by their inputs (uninitialized memory, packed
# formats) or that the audit cannot call meaningfully.
SKIPPED = ("empty_like", "_weight_norm_interface", "fbgemm_", "loss")
NUMBERS = {"Scalar": 0.5, "number": 0.5, "float": 0.5, "int": 1, "SymInt": 1, "bool": False}


def table() -> dict:
    """The decompositions tpuc's backend applies by default."""
    from tpuc.compiler import decompositions
    from tpuc.options import Options

    return decompositions(Options())


def _arguments(op):
    """The positional arguments to try `op` with, as (tensor names, numbers), or None."""
    schema = op._schema
    if schema.is_mutable or any(r.alias_info for r in schema.returns):
        return None
    if any("Generator" in str(a.type) for a in schema.arguments):
        return None  # random: its values are a distribution's (docs/random.md), not the inputs'
    tensors = [a.name for a in schema.arguments if str(a.type) == "Tensor" and not a.kwarg_only]
    if not 1 <= len(tensors) <= 3:
        return None
    numbers = {}
    for a in schema.arguments:
        if a.name in tensors or a.has_default_value() or str(a.type).startswith("Optional"):
            continue
        if a.kwarg_only or str(a.type) not in NUMBERS or "dtype" in a.name:
            return None  # (a dtype is typed int in the schema)
        numbers[a.name] = NUMBERS[str(a.type)]
    return tensors, numbers


def _call(fn, op, values):
    args = []
    for a in op._schema.arguments:
        if a.kwarg_only or (a.name not in values and a.has_default_value()):
            break
        args.append(values.get(a.name))
    return fn(*args)


def _differs(expected, got) -> str | None:
    expected = expected if isinstance(expected, (tuple, list)) else (expected,)
    got = got if isinstance(got, (tuple, list)) else (got,)
    for e, g in zip(expected, got):
        if not (isinstance(e, torch.Tensor) and isinstance(g, torch.Tensor)):
            continue
        if e.layout != torch.strided or g.layout != torch.strided:
            continue
        if e.device != g.device:
            return f"kernel on {e.device}, decomposition on {g.device}"
        if e.dtype != g.dtype or e.shape != g.shape:
            return f"kernel {e.dtype}{list(e.shape)}, decomposition {g.dtype}{list(g.shape)}"
        if e.is_complex():
            e, g = torch.view_as_real(e.resolve_conj()), torch.view_as_real(g.resolve_conj())
        try:
            close = torch.allclose(e.double(), g.double(), rtol=1e-2, atol=1e-2, equal_nan=True)
        except RuntimeError:
            continue  # functorch's batched tensors (vmap's own ops) do not compare
        if not close:
            return "values differ"
    return None


def audit(decompositions: dict, names=None) -> list[tuple[str, tuple, str]]:
    """(op, input dtypes, difference) for each mix where a decomposition differs from the
    kernel."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's own deprecation and beta notices
        return _audit(decompositions, names)


def _audit(decompositions: dict, names) -> list[tuple[str, tuple, str]]:
    found = []
    for op, decomposition in decompositions.items():
        if not isinstance(op, torch._ops.OpOverload) or any(s in str(op) for s in SKIPPED):
            continue
        if names is not None and str(op) not in names:
            continue
        arguments = _arguments(op)
        if arguments is None:
            continue
        tensors, numbers = arguments
        for dtypes in itertools.product(SAMPLES, repeat=len(tensors)):
            torch.manual_seed(0)
            values = {name: SAMPLES[d]() for name, d in zip(tensors, dtypes)}
            values.update(numbers)
            try:
                expected = _call(op, op, values)
                got = _call(decomposition, op, values)
            except Exception:
                continue  # a mix the kernel (or the decomposition's checks) rejects
            if got is NotImplemented:
                continue
            difference = _differs(expected, got)
            if difference:
                found.append((str(op), dtypes, difference))
    return found


def main(argv: list[str]) -> int:
    found = audit(table(), set(argv) or None)
    for op, dtypes, difference in found:
        print(f"{op} ({', '.join(dtypes)}): {difference}")
    print(f"{len(found)} mismatches")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
