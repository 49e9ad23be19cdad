"""What the page offers, read from the engine's typed `EngineInfo` (engine/core/info.py): exactly the
variants and speculation modes that exist, and the reason for each one this machine cannot run."""

from __future__ import annotations

from engine.core.info import EngineInfo
from engine.measure.machine_limits import MachineLimits


def describe(engine) -> EngineInfo:
    """engine.core.info(), or a bare description if the engine cannot answer (a remote that is down must
    not take the page with it)."""
    try:
        return engine.info()
    except Exception as exc:
        return EngineInfo(name=str(getattr(engine, "model", "engine")), source="unknown",
                          notes=(f"the engine did not describe itself: {type(exc).__name__}: {exc}",))


def variant_choices(info: EngineInfo) -> list[tuple[str, str]]:
    """(label, value) for the Weights dropdown: the runnable variants, the default first."""
    ordered = sorted((v for v in info.variants if v.available), key=lambda v: not v.default)
    return [(f"{v.name} (as loaded)" if v.default else v.name, v.name) for v in ordered]


def speculation_choices(info: EngineInfo) -> list[str]:
    return [s.name for s in info.speculation if s.available] or ["off"]


def unavailable_note(items) -> str:
    """'Not on this machine: nf4 — needs …' for the choices an engine cannot run (shown, not offered)."""
    missing = [f"{i.name} — {i.reason}" for i in items if not i.available]
    return ("Not on this machine: " + "; ".join(missing)) if missing else ""


def compiled_weights_note(info: EngineInfo) -> str:
    """'Not with the weights as loaded (bf16): …' where the default variant cannot take the compiled
    step but another could (the toggle stays on offer: a request names its variant)."""
    default = info.default_variant
    why = default.compiled_refused if default else None
    return f"Not with the weights as loaded ({default.name}): {why}" if why else ""


def weight_bytes(info: EngineInfo, variant: str | None) -> int | None:
    """Bytes of the chosen variant's weights, if the engine knows them."""
    v = info.variant(variant)
    return v.weight_bytes if v else None


def limits_line(info: EngineInfo) -> str:
    """The machine's measured ceilings for the header: 'machine limits: read N GB/s · copy N GB/s · fp32 matmul N TFLOP/s …'."""
    lim = info.machine_limits
    if not lim:
        return "machine limits: not measured for this backend"
    key = lim.get("key") or {}
    where = ", ".join(str(x) for x in (key.get("cpu_model"), key.get("isa"),
                                       key.get("threads") and f"{key['threads']} threads",
                                       key.get("cuda_device")) if x)
    line = MachineLimits.from_dict(lim).summary()  # one wording for the page, the CLI and the report
    return f"machine limits: {line[:-1]}{', ' + where if where else ''})"


def limits_json(info: EngineInfo) -> dict:
    return {"line": limits_line(info), "limits": info.machine_limits}
