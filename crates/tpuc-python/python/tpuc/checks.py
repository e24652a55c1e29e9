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

_SETTINGS = {"finite": False, "compare": False, "rtol": 1e-4, "atol": 1e-5}


def debug(on: bool = True, *, finite: bool = False, compare: bool = False, rtol: float = 1e-4,
          atol: float = 1e-5) -> None:
    """Debug mode on (or off: strict mode again), with its checks."""
    _SETTINGS.update(finite=finite, compare=compare, rtol=rtol, atol=atol)
    _tpuc_native.set_debug_runner(run if on else None)


def run(name: str, overload: str, arguments: list, proceed):
    """Op `name.overload` on `arguments` run (`proceed()`, which returns its results) and
    checked."""
    func = planner.op_of(name, overload)
    args, kwargs, _ = planner.bind(func, arguments)
    checking = _SETTINGS["finite"] or _SETTINGS["compare"]
    with _disable_current_modes():
        before = tree_map(planner.to_host, (args, kwargs)) if checking else None
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
            op_tracing.check_results(func, *before, got, bool(written), finite=_SETTINGS["finite"],
                                     compare=_SETTINGS["compare"] and not _random(func),
                                     rtol=_SETTINGS["rtol"], atol=_SETTINGS["atol"])
    return None


def _random(func) -> bool:
    """Whether the op draws random numbers (its draws on the device and the CPU differ)."""
    return torch.Tag.nondeterministic_seeded in func.tags
