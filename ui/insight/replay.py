"""Speculation replayed: a reply's tokens grouped by the step that produced them, each verify's
accepted drafts, rejected drafts and the target's own token told apart (hover: which step, which
draft position), acceptance by draft position, the speedup the measured acceptance and costs
predict beside the one measured, and a plain warning when speculation costs time.

From the Timeline's `draft_steps` (engine/speculative/replay.py) and the reply's token ids. Pure
functions: `decode` turns token ids into text.
"""

from __future__ import annotations

import html
import statistics

from engine.speculative.replay import DraftStep, acceptance_by_position

from ..shell.glossary import hover


MIN_PLAIN_STEPS = 3  # fewer plain steps in the reply than this: its own plain-step time is too thin


def plain_steps_ms(timeline: dict) -> list[float]:
    """The gaps before each token a plain decode step produced in this reply (no draft verified):
    this reply's own plain step, on the same machine load as its verifies."""
    token_ms = timeline.get("token_ms") or []
    steps = [DraftStep.from_list(s) for s in timeline.get("draft_steps") or []]
    covered = {s.at + j for s in steps for j in range(s.accepted + 1)}
    end = len(token_ms)
    if (timeline.get("draft_step_count") or 0) > len(steps) and steps:  # the record was cut: stop where it ends
        end = steps[-1].at + steps[-1].accepted + 1
    return [token_ms[i] - token_ms[i - 1] for i in range(1, min(end, len(token_ms)))
            if i not in covered and token_ms[i] is not None and token_ms[i - 1] is not None]


def plain_step(timeline: dict) -> tuple[float | None, str]:
    """(a plain decode step's ms, where it comes from): the median of this reply's own plain steps,
    else the step the cost calibration measured in this process."""
    own = plain_steps_ms(timeline)
    if len(own) >= MIN_PLAIN_STEPS:
        return statistics.median(own), f"median of this reply's {len(own)} plain steps"
    calibrated = timeline.get("plain_step_ms") or (timeline.get("cost_model") or {}).get("step_ms")
    return calibrated, "the plain step measured by the cost calibration in this process"


def measured_speedup(timeline: dict) -> float | None:
    """A plain decode step (`plain_step`) / this reply's TPOT."""
    step_ms, tpot = plain_step(timeline)[0], timeline.get("tpot_ms")
    return step_ms / tpot if step_ms and tpot else None


def figures(timeline: dict) -> dict:
    steps = [DraftStep.from_list(s) for s in timeline.get("draft_steps") or []]
    cost = timeline.get("cost_model") or {}
    step_ms, step_from = plain_step(timeline)
    return {"steps": len(steps), "step_count": timeline.get("draft_step_count"),
            "acceptance_by_position": acceptance_by_position(steps),
            "predicted_speedup": timeline.get("predicted_speedup"), "measured_speedup": measured_speedup(timeline),
            "plain_step_ms": step_ms, "plain_step_from": step_from,
            "costs_measured": bool(timeline.get("plain_step_ms") or cost.get("measured")),
            "tpot_ms": timeline.get("tpot_ms"), "acceptance_rate": timeline.get("acceptance_rate")}


def _tok(cls: str, step: int, title: str, text: str, tag: str = "span") -> str:
    return (f'<{tag} class="{cls}" data-step="{step}" title="{html.escape(title)}">'
            f'{html.escape(text)}</{tag}>')


def tokens_html(token_ids: list[int], steps: list[DraftStep], decode) -> tuple[str, int]:
    """The reply, token by token, with each verify's drafts; returns (html, the last step number).
    Step 0 is the first token (prefill); each plain decode step and each verify is one step."""
    by_at = {s.at: s for s in steps}
    parts, i, step, verify = [], 0, 0, 0
    while i < len(token_ids):
        s = by_at.get(i) if i else None
        if s is None:
            what = "prefill: the first token" if i == 0 else "a plain decode step (no draft verified)"
            parts.append(_tok("lab-tok", step, f"step {step}: {what}", decode([token_ids[i]])))
            i += 1
        else:
            verify += 1
            k = len(s.drafted)
            for j in range(s.accepted):
                if i + j < len(token_ids):
                    parts.append(_tok("lab-tok-acc", step, f"step {step} (verify {verify}): draft {j + 1} of {k}, "
                                      "accepted", decode([token_ids[i + j]])))
            for j in range(s.accepted, k):
                parts.append(_tok("lab-tok-rej", step, f"step {step} (verify {verify}): draft {j + 1} of {k}, "
                                  "rejected" + (" (the target chose the next token instead)" if j == s.accepted else ""),
                                  decode([s.drafted[j]]), "s"))
            if i + s.accepted < len(token_ids):
                parts.append(_tok("lab-tok-own", step, f"step {step} (verify {verify}): the target's own token "
                                  f"after {s.accepted} accepted", decode([token_ids[i + s.accepted]])))
            i += s.accepted + 1
        step += 1
    return "".join(parts), step - 1


def warning(f: dict) -> str:
    """A plain sentence when speculation is costing time here ('' when it is not, or unknown)."""
    measured, predicted = f["measured_speedup"], f["predicted_speedup"]
    slow = measured is not None and measured < 1
    if not slow and not (predicted is not None and predicted < 1):
        return ""
    acc = f["acceptance_rate"]
    acc_text = "—" if acc is None else f"{100 * acc:.0f}%"
    if slow:
        head = (f"Speculation is costing time in this reply: its TPOT ({f['tpot_ms']:,.1f} ms) is above a plain "
                f"decode step ({f['plain_step_ms']:,.1f} ms, {f['plain_step_from']}), {measured:.2f}x.")
    else:
        head = f"Speculation is predicted to cost time here ({predicted:.2f}x)."
    return (f"{head} Only {acc_text} of the drafted tokens were accepted, and each verify costs more than a plain "
            "step: switch Speculation off for prompts like this one, or keep Adaptive k on so it stops guessing.")


def replay_html(timeline: dict, token_ids: list[int] | None, decode) -> str:
    """The replay block under a reply ('' when it had no speculation)."""
    if not timeline.get("draft_steps") and not timeline.get("draft_step_count"):
        return ""
    f = figures(timeline)
    steps = [DraftStep.from_list(s) for s in timeline.get("draft_steps") or []]
    body, last = tokens_html(token_ids or [], steps, decode) if token_ids else ("", 0)
    esc = html.escape
    rejected = sum(len(s.drafted) - s.accepted for s in steps)
    by_pos = " · ".join(f"{j}: {'—' if v is None else f'{100 * v:.0f}%'}"
                        for j, v in enumerate(f["acceptance_by_position"], start=1))

    def x(v):
        return "—" if v is None else f"{v:.2f}x"

    costs_note = "" if f["costs_measured"] else " (default costs: nothing was measured in this process)"
    warn = warning(f)
    kept = "" if f["step_count"] == f["steps"] else f" (the first {f['steps']} of {f['step_count']} verifies)"
    return (
        f'<div class="lab-replay" data-last-step="{last}">'
        f'<div class="lab-replay-head"><b>Speculation replayed</b>{esc(kept)}: '
        f'<span class="lab-tok-acc">accepted draft</span> <s class="lab-tok-rej">rejected draft</s> '
        f'<span class="lab-tok-own">target\'s own token</span> · {f["steps"]} verifies, rejected drafts: {rejected} '
        f'<label class="lab-replay-ctl">step <input type="range" min="0" max="{last}" value="{last}" '
        f'class="lab-replay-step"> <span class="lab-replay-at">{last} of {last}</span></label></div>'
        f'<div class="lab-replay-tokens">{body}</div>'
        f'<div class="lab-replay-figs"><span title="{esc(hover("acceptance_by_position"))}">acceptance by draft '
        f'position: {esc(by_pos) or "—"}</span> · <span class="lab-spec-predicted" '
        f'title="{esc(hover("predicted_speedup"))}">predicted speedup {x(f["predicted_speedup"])}{esc(costs_note)}'
        f'</span> · <span class="lab-spec-measured" title="{esc(hover("measured_speedup"))}">measured '
        f'{x(f["measured_speedup"])}</span> <span class="lab-muted">(a plain step: {esc(f["plain_step_from"])})'
        f'</span></div>'
        + (f'<p class="lab-spec-warning">{esc(warn)}</p>' if warn else "") + "</div>")
