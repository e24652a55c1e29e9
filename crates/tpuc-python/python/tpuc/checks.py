"""Debug mode on the native device: every op's results are read back when it runs, so that an
error names the op and the line of the user's code that ran it; `finite` stops at the first op
that makes a NaN or an infinity from finite inputs; `compare` runs every op on the CPU too (on
copies of its inputs taken before it ran) and stops at the first whose result differs beyond
`rtol`/`atol`, saying by how much. The native layer runs each op through `run` while it is on."""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map

from . import _tpuc, _tpuc_native, op_tracing, planner
from .tolerance import difference

_SETTINGS = {"finite": False, "compare": False, "rtol": 1e-4, "atol": 1e-5}


def debug(on: bool = True, *, finite: bool = False, compare: bool = False, rtol: float = 1e-4,
          atol: float = 1e-5) -> None:
    """Debug mode on (or off: strict mode again), with its checks."""
    _SETTINGS.update(finite=finite, compare=compare, rtol=rtol, atol=atol)
    _tpuc_native.set_debug_runner(run if on else None)


def _to_host(value):
    return value.cpu() if planner.on_device(value) else value


def run(name: str, overload: str, arguments: list, proceed):
    """Op `name.overload` on `arguments` run (`proceed()`, which returns its results) and
    checked."""
    func = planner.op_of(name, overload)
    args, kwargs, _ = planner.bind(func, arguments)
    checking = _SETTINGS["finite"] or _SETTINGS["compare"]
    with _disable_current_modes():
        before = tree_map(_to_host, (args, kwargs)) if checking else None
    try:
        results = proceed()
    except Exception as error:  # noqa: BLE001 - said again with the op and the user's line
        raise _tpuc.TpucError(f"{func} failed at {op_tracing.user_line()}: {error}") from error
    schema = op_tracing.schema(func)
    with _disable_current_modes():
        written = schema.written_tensors(args, kwargs)
        values = written or [r for r in tree_flatten(results)[0] if planner.on_device(r)]
        got = [v.cpu() for v in values]  # read back: the op's errors surface here, at its line
        if checking:
            _check(func, before, got, bool(written))
    return None


def _check(func, before, got: list, mutated: bool) -> None:
    cpu_args, cpu_kwargs = before
    if _SETTINGS["finite"]:
        inputs_finite = all(bool(torch.isfinite(t).all()) for t in tree_flatten((cpu_args, cpu_kwargs))[0]
                            if isinstance(t, torch.Tensor) and t.is_floating_point())
        for value in got:
            if inputs_finite and value.is_floating_point() and not bool(torch.isfinite(value).all()):
                raise _tpuc.TpucError(f"{func} made a NaN or an infinity from finite inputs, at "
                                      f"{op_tracing.user_line()}")
    if _SETTINGS["compare"] and not _random(func):
        result = func(*cpu_args, **cpu_kwargs)
        if mutated:
            expected = op_tracing.schema(func).written_tensors(cpu_args, cpu_kwargs)
        else:
            expected = [r for r in tree_flatten(result)[0] if isinstance(r, torch.Tensor)]
        for value, want in zip(got, expected):
            found = difference(value, want, _SETTINGS["rtol"], _SETTINGS["atol"])
            if found is not None:
                raise _tpuc.TpucError(f"{func} differs from the CPU's result by {found}, at {op_tracing.user_line()}")


def _random(func) -> bool:
    """Whether the op draws random numbers (its draws on the device and the CPU differ)."""
    return torch.Tag.nondeterministic_seeded in func.tags
