"""One switch per kernel of ours, declared here and nowhere else.

Each of our CPU kernels can be turned off on its own, by its environment variable set to `off`
(or `0`), or for a stretch of code by `forced_off(name)` (a bench measuring both sides). Turned off,
torch's own op serves instead: the products go to ATen/oneDNN (the execution plan, engine/runtime/plan.py, reads the switches when it is made), decode
attention to SDPA, and the layer loop runs in Python. The layer loop needs our product kernel, so
turning `gemm` off turns it off too (its reason says so).

`LATENCY_LAB_GEMV=off`, the one switch of earlier versions, still turns all three off at once.
No torch here: engine info and the page read the declarations.
"""

from __future__ import annotations

import contextlib
import contextvars
import os

# name -> (environment variable, what turning it off hands the work to)
SWITCHES = {
    "gemm": ("LATENCY_LAB_GEMM", "our fp32, int8 and 4-bit product kernels (engine/kernels/cpu_gemm.py)"),
    "attention": ("LATENCY_LAB_ATTENTION", "our decode attention kernel (engine/kernels/cpu_attention.py)"),
    "layers": ("LATENCY_LAB_LAYERS", "the layer loop in one C++ call (engine/kernels/cpu_layers.py)"),
}
ALL_OFF = "LATENCY_LAB_GEMV"  # the former single switch: off turns every kernel above off
_OFF_WORDS = ("0", "off", "torch", "python")
_forced: contextvars.ContextVar[frozenset] = contextvars.ContextVar("latency_lab_forced_off", default=frozenset())


def off_reason(name: str) -> str | None:
    """Why kernel `name` (a key of SWITCHES) is switched off here, None where it is on."""
    var = SWITCHES[name][0]
    if os.environ.get(ALL_OFF, "").lower() in _OFF_WORDS:
        return f"turned off ({ALL_OFF}=off)"
    if os.environ.get(var, "").lower() in _OFF_WORDS:
        return f"turned off ({var}=off)"
    if name in _forced.get():
        return f"turned off for a measurement (switches.forced_off({name!r}))"
    return None


@contextlib.contextmanager
def forced_off(*names: str):
    """Kernels `names` off for the code in this block, in this thread (`bench bandwidth --python-loop`)."""
    unknown = set(names) - set(SWITCHES)
    if unknown:
        raise ValueError(f"no kernel switch named {sorted(unknown)}; the switches are {sorted(SWITCHES)}")
    token = _forced.set(_forced.get() | frozenset(names))
    try:
        yield
    finally:
        _forced.reset(token)


def describe() -> dict:
    """Every switch and its state, for engine info: {name: {"env": VAR, "kernel": ..., "off": reason|None}}."""
    return {name: {"env": var, "kernel": what, "off": off_reason(name)} for name, (var, what) in SWITCHES.items()}
