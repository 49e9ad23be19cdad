"""`latency-lab report`'s output from its report.json: the table (one line per step), report.md, the
plots, report.html (all of it in one self-contained file, the plots inline: no network, nothing
beside it, to attach or open anywhere) and the README's results table. Apart from the driver
(report.py) so that a report can be rendered again (`--from DIR`) without measuring.

Plots are SVG written here by hand: matplotlib is not a dependency, and two bar charts do not
justify one (nor plotly's static export, which needs a browser engine).
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path


def _f(v, nd=1, unit=""):
    return "—" if v is None else f"{v:,.{nd}f}{unit}"


def _pct(v):
    return "—" if v is None else f"{100 * v:.0f}%"


def _share(v: dict) -> str:
    """A bandwidth bench row's share of the read bandwidth, as the bench prints it: never above 100%; a step
    from the last-level cache, or above a stale limit, says so instead (engine/measure/machine_limits.py)."""
    from engine.measure.machine_limits import STALE_NOTE, over_limit

    fraction = v.get("fraction_of_read")
    if v.get("limit_stale") or (over_limit(fraction) and not v.get("from_cache")):
        return STALE_NOTE
    return "from the last-level cache" if over_limit(fraction) else _pct(fraction)


# --- one line per step ------------------------------------------------------------------------------
def limits_line(r: dict) -> str:
    from engine.measure.machine_limits import MachineLimits

    return MachineLimits.from_dict(r).summary()


def bandwidth_line(r: dict) -> str:
    rows = r.get("variants") or {}
    parts = [f"{name} {_f(v.get('tok_s'))} tok/s ({_share(v)})" for name, v in rows.items()]
    refused = f"; not here: {', '.join(r['refused'])}" if r.get("refused") else ""
    return (f"decode tok/s (% of the {_f(r.get('read_gbps'))} GB/s read bandwidth), context {r.get('context')}: "
            + ", ".join(parts) + refused)


def kv_line(r: dict) -> str:
    return (f"last-turn TTFT {_f(r.get('ttft_ms_with_reuse'), 0)} ms with reuse vs "
            f"{_f(r.get('ttft_ms_without_reuse'), 0)} ms without (**{_f(r.get('ratio'), 1)}x**), "
            f"{r.get('prompt_tokens')} prompt tokens, {r.get('dtype')}; identical {r.get('identical')}")


def lookup_line(r: dict) -> str:
    line = (f"copy-heavy decode **{_f(r.get('ratio'), 2)}x** (geo-mean; worst prompt {_f(r.get('worst_ratio'), 2)}x), "
            f"{_f(r.get('off_decode_tps'))} → {_f(r.get('on_decode_tps'))} tok/s")
    if r.get("open_ended_ratio") is not None:
        line += f"; open-ended {_f(r['open_ended_ratio'], 2)}x"
    return line + f"; {r.get('dtype')}, identical {r.get('identical')}"


def batching_line(r: dict) -> str:
    rows, (a, b) = r.get("comparison") or [], (r.get("max_batches") or [1, 8])[:2]
    parts = [f"{x['clients']} clients: output {_f(x.get('tok_per_s_a'))} → {_f(x.get('tok_per_s_b'))} tok/s "
             f"(**{_f(x.get('tok_per_s_ratio'), 2)}x**), p50 TTFT {_f(x.get('ttft_p50_a'), 0)} → "
             f"{_f(x.get('ttft_p50_b'), 0)} ms" for x in rows]
    return f"max batch {a} → {b}: " + "; ".join(parts) + f"; judge ok {r.get('ok')}"


def peer_line(r: dict) -> str:
    q = r.get("ratios") or {}
    best = r.get("best")
    t = (r.get("table") or {})
    ours, theirs = t.get(best) or {}, t.get("llama.cpp") or {}
    return (f"decode {_f(ours.get('decode_tps_short'))} vs {_f(theirs.get('decode_tps_short'))} tok/s "
            f"(**{_f(q.get('decode_short'), 2)}x**, ours {best}), after a long prompt {_f(q.get('decode_long'), 2)}x; "
            f"cold TTFT {_f(q.get('cold_ttft_speedup'), 2)}x faster, warm TTFT {_f(q.get('warm_ttft_ratio'), 2)}x "
            f"theirs; llama-cpp-python {r.get('peer_version')}" + "".join(
                f"; vs {name}: decode {_f(ours.get('decode_tps_short'))} vs {_f(row.get('decode_tps_short'))} tok/s "
                f"(**{_f(_ratio(ours.get('decode_tps_short'), row.get('decode_tps_short')), 2)}x**), after a long prompt "
                f"{_f(_ratio(ours.get('decode_tps_long'), row.get('decode_tps_long')), 2)}x"
                for name, row in t.items() if name.startswith("ort-genai")))


def _ratio(a, b):
    return a / b if a and b else None


def gpu_line(r: dict) -> str:
    """The GPU check's verdict, each target's pass (— where not judged), the GPU's read bandwidth."""
    marks = {True: "pass", False: "**FAIL**", None: "—"}
    targets = ", ".join(f"{name} {marks[t.get('pass')]}" for name, t in (r.get("targets") or {}).items())
    facts = ((r.get("stages") or {}).get("facts") or {}).get("figures") or {}
    limits = facts.get("limits") or {}
    return (f"{facts.get('device_name') or r.get('device')}: verdict **{'PASS' if r.get('ok') else 'FAIL'}**; "
            f"read {_f(limits.get('read_gbps'))} GB/s; {targets}")


LINES = {"limits": limits_line, "bandwidth": bandwidth_line, "gpu": gpu_line, "kv": kv_line, "lookup": lookup_line, "batching": batching_line,
         "peer": peer_line}


def step_line(step: dict) -> str:
    if step.get("result") is None:
        last = (step.get("error") or "").strip().splitlines()[-1:] or ["no result"]
        return f"failed (exit {step.get('rc')}): {last[0][:160]}"
    try:
        return LINES[step["name"]](step["result"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:  # a bench's JSON changed shape
        return f"(no summary: {type(exc).__name__} {exc})"


# --- the table, report.md, the README ----------------------------------------------------------------
def machine_line(report: dict) -> str:
    m = report["machine"]
    gpu = f"; GPU {m['gpu']}" if m.get("gpu") else ""
    la = report.get("load_avg_start")
    load = f"; load average {la[0]} at the start on {m.get('cores')} cores" if la else ""
    return f"{m['cpu']}; {m.get('threads')} threads{gpu}{load}"


def table(report: dict, command_prefix: str = "") -> str:
    lines = ["| what | result | command |", "|---|---|---|"]
    for s in report["steps"]:
        cmd = s["command"].replace(" --json", "")
        lines.append(f"| {s['what']} | {step_line(s).replace('|', '/')} | `{command_prefix}{cmd}` |")
    return "\n".join(lines)


def header(report: dict) -> str:
    v = report["machine"]["versions"]
    when = report["started"].replace("T", " ").replace("Z", " UTC")
    quick = " **`--quick`: every step at its smallest; do not quote these figures.**" if report.get("quick") else ""
    note = f" {report['note']}" if report.get("note") else ""
    return (f"Measured by `latency-lab report` on {when}: {machine_line(report)}; torch {v.get('torch')}, "
            f"transformers {v.get('transformers')}, commit {v.get('commit') or '?'}; "
            f"{_f(report.get('seconds'), 0)} s in all.{quick}{note}")


def markdown(report: dict, plots: list[str]) -> str:
    parts = [f"# Latency Lab report, {report['started'][:10]}", "", header(report), "", table(report), ""]
    for name in plots:
        parts += [f"![{name}](plots/{name})", ""]
    parts += ["## Each step", ""]
    for s in report["steps"]:
        parts += [f"- **{s['name']}** ({s['seconds']} s, exit {s['rc']}): `{s['command']}`; output: `{s['log']}`"]
    parts += ["", "## Machine and versions", "", *(f"- {line}" for line in machine_lines(report)), ""]
    return "\n".join(parts)


def machine_lines(report: dict) -> list[str]:
    m = report["machine"]
    return [f"CPU: {m['cpu']}", f"GPU: {m.get('gpu') or 'none'}", f"OS: {m.get('os')}",
            f"cores {m.get('cores')}, torch threads {m.get('threads')}",
            f"load average at start {report.get('load_avg_start')}, at end {report.get('load_avg_end')} "
            "(1, 5, 15 min): above the core count, other jobs shared the machine",
            "versions: " + ", ".join(f"{k} {v}" for k, v in m["versions"].items())]


def write(folder: Path, report: dict) -> str:
    plots = write_plots(folder, report)
    md = markdown(report, plots)
    (folder / "report.md").write_text(md)
    (folder / "report.html").write_text(html_page(report))
    return table(report)


# --- report.html: one file, nothing fetched --------------------------------------------------------------
STYLE = """body{font:14px/1.45 system-ui,sans-serif;max-width:1100px;margin:24px auto;padding:0 16px;color:#222}
table{border-collapse:collapse;width:100%;margin:12px 0}th,td{border:1px solid #ccc;padding:4px 8px;text-align:left;
vertical-align:top}th{background:#f3f3f3}code{background:#f4f4f4;padding:0 3px;font-size:12px}
figure{margin:16px 0}"""


def _inline(text: str) -> str:
    """The table's Markdown marks (**bold**, `code`) as HTML, everything else escaped."""
    out = html.escape(text, quote=False)
    out = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", out)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", out)


def html_page(report: dict) -> str:
    """report.md's content as one HTML page: its plots inline (SVG), no script, no link, no fetch."""
    esc = html.escape
    rows = "".join(f"<tr><td>{esc(s['what'])}</td><td>{_inline(step_line(s))}</td>"
                   f"<td><code>{esc(s['command'].replace(' --json', ''))}</code></td></tr>" for s in report["steps"])
    figures = "".join(f"<figure>{svg}</figure>" for svg in plots(report).values())
    steps = "".join(f"<li><strong>{esc(s['name'])}</strong> ({s['seconds']} s, exit {s['rc']}): "
                    f"<code>{esc(s['command'])}</code>; output: <code>{esc(s['log'])}</code></li>" for s in report["steps"])
    machine = machine_lines(report)
    title = f"Latency Lab report, {report['started'][:10]}"
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
            f"<style>{STYLE}</style></head><body>\n<h1>{esc(title)}</h1>\n<p>{_inline(header(report))}</p>\n"
            f"<table><tr><th>what</th><th>result</th><th>command</th></tr>{rows}</table>\n{figures}\n"
            f"<h2>Each step</h2><ul>{steps}</ul>\n<h2>Machine and versions</h2><ul>"
            + "".join(f"<li>{esc(line)}</li>" for line in machine) + "</ul>\n</body></html>\n")


def rewrite_readme(path: Path, report: dict, begin: str, end: str) -> None:
    """Replace what lies between the README's markers with this report's header and table."""
    text = path.read_text()
    if begin not in text or end not in text:
        raise ValueError(f"{path} has no {begin} ... {end} markers to put the table between")
    body = f"{begin}\n{header(report)}\n\n{table(report)}\n{end}"
    path.write_text(re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: body, text, flags=re.S))


# --- plots ------------------------------------------------------------------------------------------
def bars_svg(title: str, labels: list[str], series: dict[str, list[float | None]], unit: str,
             notes: list[str] | None = None) -> str:
    """Horizontal grouped bars: one group per label, one bar per series; the value (and note) beside each."""
    colors = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759"]
    n = len(series)
    bar_h, gap, left, width = 14, 10, 190, 360
    top = 40 + 16 * (n > 1)
    height = top + len(labels) * (n * bar_h + gap) + 10
    top_value = max([v for vs in series.values() for v in vs if v is not None] or [1.0])
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 280}" height="{height}" '
           f'font-family="sans-serif" font-size="12">', f'<text x="8" y="20" font-size="14" font-weight="bold">'
           f'{html.escape(title)}</text>']
    for j, name in enumerate(series if n > 1 else ()):
        out.append(f'<rect x="{left + 110 * j}" y="30" width="10" height="10" fill="{colors[j % 4]}"/>'
                   f'<text x="{left + 110 * j + 14}" y="39">{html.escape(name)}</text>')
    for i, label in enumerate(labels):
        y0 = top + i * (n * bar_h + gap)
        out.append(f'<text x="{left - 6}" y="{y0 + n * bar_h / 2 + 4}" text-anchor="end">{html.escape(label)}</text>')
        for j, values in enumerate(series.values()):
            v = values[i] if i < len(values) else None
            w = 0 if v is None else max(1.0, width * v / top_value)
            y = y0 + j * bar_h
            note = f" ({notes[i]})" if notes and i < len(notes) and notes[i] and n == 1 else ""
            out.append(f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{bar_h - 2}" fill="{colors[j % 4]}"/>'
                       f'<text x="{left + w + 4:.1f}" y="{y + bar_h - 4}">{_f(v)} {html.escape(unit)}'
                       f'{html.escape(note)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def write_plots(folder: Path, report: dict) -> list[str]:
    (folder / "plots").mkdir(exist_ok=True)
    drawn = plots(report)
    for name, svg in drawn.items():
        (folder / "plots" / name).write_text(svg)
    return list(drawn)


def plots(report: dict) -> dict[str, str]:
    """{file name: SVG} of each step that has a plot."""
    written = {}
    for s in report["steps"]:
        r = s.get("result") or {}
        if s["name"].startswith("bandwidth") and r.get("variants"):
            names = list(r["variants"])
            shares = [_share(r["variants"][k]) for k in names]
            svg = bars_svg(f"decode per weights variant ({s['name']})", names,
                           {"tok/s": [r["variants"][k].get("tok_s") for k in names]}, "tok/s",
                           [share + " of read bandwidth" if share.endswith("%") else share for share in shares])
        elif s["name"] == "batching" and r.get("comparison"):
            rows, (a, b) = r["comparison"], r["max_batches"][:2]
            svg = bars_svg("continuous batching: output tok/s", [f"{x['clients']} clients" for x in rows],
                           {f"max batch {a}": [x.get("tok_per_s_a") for x in rows],
                            f"max batch {b}": [x.get("tok_per_s_b") for x in rows]}, "tok/s")
        elif s["name"].startswith("limits") and r.get("details"):
            names = [k for k in ("read", "copy") if (r["details"].get(k) or {}).get("best")]  # one unit: GB/s
            svg = bars_svg(f"memory bandwidth over the probe's rounds: best (the limit), median, worst ({s['name']})",
                           names, {k: [r["details"][n].get(k) for n in names] for k in ("best", "median", "worst")},
                           "GB/s")
        else:
            continue
        written[f"{s['name']}.svg"] = svg
    return written


def load(folder: Path) -> dict:
    return json.loads((Path(folder) / "report.json").read_text())
