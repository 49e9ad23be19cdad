"""`python -m ui.bench transport|rate|markdown|smooth`: what the page's transport costs, and what
smoothing does, in Chromium.

transport  Replies sent through the page (real clicks on Send), alternating our SSE stream and
           Gradio's queue, on the bundled model (or --paced-source). Prints transport_overhead_ms
           (client_ttft_ms − ttft_ms) p50/p90 per transport, and its split into network in and
           network out + paint (through the clock offset).
rate       The paced test source at increasing token rates: does the page keep up? (--plain: text
           painted as one Text node, as before markdown; --markdown-text: the source streams markdown;
           each run also reports the main-thread ms per text update, `render_ms_per_update`.) For each
           chunk, lag = its arrival (or paint) minus the server's emit time on the browser's axis;
           a transport keeps up when that lag does not grow over the reply (last fifth vs first
           fifth of the chunks).

markdown   The markdown renderer alone (ui/chat/markdown.js) against one plain Text node: a 600-token
           markdown reply appended token by token with a forced layout after each, ms per reply.

smooth     One bursty reply, painted with smoothing off, adaptive by word and adaptive by
           character, alternating: the perceived metrics (ui/chat/perceived.py) per mode, medians.
           Default source: a recorded speculative reply (tests/js/traces/prompt_lookup_cpu.json)
           replayed by the paced source at its recorded times, so every mode gets the very same
           bursts; --engine: the bundled model with prompt-lookup speculation on a copy edit.

All drive headless Chromium; all but markdown start the app on a free loopback port in this process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from engine.cli import comma_list

from .compare.delta import percentile
from .chat.settings import defaults
from .shell.static import PREFIX, route_modules

TRACES = Path(__file__).resolve().parents[1] / "tests" / "js" / "traces" / "prompt_lookup_cpu.json"
SMOOTH_MODES = (("off", "word"), ("adaptive", "word"), ("adaptive", "char"))
SMOOTH_METRICS = ("paint_gap_cv", "paint_gap_max_ms", "frame_gap_cv", "frame_gap_max_ms", "smoothing_hold_ms",
                  "client_first_word_ms", "client_ttft_ms", "client_e2e_ms")

CHROMIUM = os.environ.get("LATENCY_LAB_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
TRANSPORTS = ("sse", "gradio")
PROMPTS = ["What is the capital of France?", "Name three colors.", "Say hello in Spanish.",
           "What is 2 + 2?", "Name a large animal.", "What color is the sky?"]


def _stats(values: list[float]) -> dict:
    xs = [v for v in values if v is not None]
    if not xs:
        return {"n": 0}
    return {"n": len(xs), "p50": round(percentile(xs, 50), 2), "p90": round(percentile(xs, 90), 2),
            "min": round(min(xs), 2), "max": round(max(xs), 2)}


def _open(browser, url):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(url)
    page.wait_for_selector("#lab-send")
    page.wait_for_function("() => window.lab && window.lab.session && window.lab.clock.offset !== null")
    return page


def _choose_transport(page, transport: str) -> None:
    label = "SSE" if transport == "sse" else "Gradio"
    page.click(f"#lab-transport label:has-text('{label}')")


def _wait_reply(page, index: int, timeout_ms: float = 120_000) -> dict:
    page.wait_for_function(f"() => window.lab.panes.chat && window.lab.panes.chat.runs.length > {index}"
                           f" && window.lab.panes.chat.runs[{index}].finished"
                           f" && (window.lab.panes.chat.runs[{index}].client || window.lab.panes.chat.runs[{index}].error)",
                           timeout=timeout_ms)
    run = page.evaluate(f"() => {{ const r = window.lab.panes.chat.runs[{index}];"
                        " return {error: r.error, row: r.row, client: r.client, timeline: r.timeline}; }")
    if run["error"]:
        raise RuntimeError(f"reply {index} failed: {run['error']}")
    return run


def bench_transport(url: str, browser, replies: int, max_tokens: int) -> dict:
    page = _open(browser, url)
    box = page.locator("#lab-chat-max input[type=number]")
    box.fill(str(max_tokens))
    box.press("Tab")
    rows = {t: [] for t in TRANSPORTS}
    for i in range(2 * replies + 2):  # two warm-up replies (first use of each path), then alternate
        transport = TRANSPORTS[i % 2]
        _choose_transport(page, transport)
        page.fill("#lab-msg textarea", PROMPTS[i % len(PROMPTS)])
        page.click("#lab-send")
        run = _wait_reply(page, i)
        if i >= 2:
            rows[transport].append(run["row"])
        page.wait_for_timeout(200)
    cost = page.evaluate("() => window.lab.overlayCost")
    page.close()
    out = {"replies_per_transport": replies, "max_tokens": max_tokens}
    for t, rs in rows.items():
        out[t] = {name: _stats([r[name] for r in rs]) for name in
                  ("transport_overhead_ms", "network_in_ms", "network_out_ms", "ttft_ms", "client_ttft_ms",
                   "clock_bound_ms")}
    gap = [a - b for a, b in zip(
        [r["transport_overhead_ms"] for r in rows["gradio"]], [r["transport_overhead_ms"] for r in rows["sse"]])]
    out["gradio_minus_sse_overhead_ms"] = _stats(gap)
    out["overlay_redraw_ms"] = {"mean": round(cost["total"] / max(cost["n"], 1), 3), "max": round(cost["max"], 3),
                                "redraws": cost["n"]}
    return out


def _lags(run: dict) -> dict:
    """Per chunk: arrival and paint minus the server's emit time, on the browser's axis."""
    c, tl = run["client"], run["timeline"]
    received, tokens = c.get("network_in_ms"), tl.get("token_ms") or []
    if received is None:
        raise RuntimeError("no clock offset: cannot place server emits on the browser's axis")
    arrival, paint, counts = [], [], []
    for t_arr, t_paint, n in zip(c["arrival_ms"], c["paint_ms"], c["arrival_tokens"]):
        if not 0 < n <= len(tokens):
            continue
        emit = received + tokens[n - 1]
        arrival.append(t_arr - emit)
        counts.append(n)
        if t_paint is not None:
            paint.append(t_paint - emit)
    return {"arrival": arrival, "paint": paint}


def _growth(lags: list[float]) -> float | None:
    k = max(1, len(lags) // 5)
    if len(lags) < 10:
        return None
    return statistics.median(lags[-k:]) - statistics.median(lags[:k])


def bench_rate(url: str, browser, source, rates: list[float], seconds: float, keep_up_ms: float,
               markdown: bool = True, transports=TRANSPORTS) -> dict:
    """Each transport at increasing rates until it stops keeping up (the rest would only take longer).
    `markdown` False: the reply paints as one plain Text node (the page before markdown rendering)."""
    page = _open(browser, url)
    page.evaluate(f"() => {{ window.lab.markdown = {'true' if markdown else 'false'}; }}")
    fields = page.evaluate("() => window.LAB_CONFIG.fields")
    results, index = [], 0
    for transport in transports:
        for rate in rates:
            source.tokens_per_s = rate
            page.evaluate("async () => { await window.lab.clear('chat'); Object.assign(window.lab.renderCost, {n: 0, total: 0, max: 0}); }")
            settings = {**defaults(), "max_new_tokens": int(rate * seconds), "temperature": 0, "backend": "local"}
            args = ["Stream as fast as you can."] + [settings[f] for f in fields] + [transport, 5.3]
            page.evaluate("(args) => window.lab.sendChat(args)", args)
            try:
                run = _wait_reply(page, index, timeout_ms=seconds * 1000 * 5 + 10_000)
            except Exception:  # far behind: stop it, note it, and stop raising the rate
                page.evaluate("() => window.lab.stop('chat')")
                page.wait_for_function(f"() => window.lab.panes.chat.runs[{index}].finished", timeout=120_000)
                results.append({"tokens_per_s": rate, "transport": transport, "kept_up": False,
                                "note": f"not finished {seconds * 5 + 10:.0f} s after send: stopped"})
                print(json.dumps(results[-1]), file=sys.stderr)
                index += 1
                break
            index += 1
            lags = _lags(run)
            growth = {k: _growth(v) for k, v in lags.items()}
            reads = len(set(run["client"]["arrival_ms"]))
            cost = page.evaluate("() => window.lab.renderCost")
            results.append({
                "tokens_per_s": rate, "transport": transport, "tokens": run["row"]["output_tokens"],
                "chunks_per_arrival": round(len(run["client"]["arrival_ms"]) / max(reads, 1), 2),
                "arrival_lag_ms": _stats(lags["arrival"]), "paint_lag_ms": _stats(lags["paint"]),
                "arrival_lag_growth_ms": None if growth["arrival"] is None else round(growth["arrival"], 1),
                "paint_lag_growth_ms": None if growth["paint"] is None else round(growth["paint"], 1),
                "clock_bound_ms": run["client"].get("clock_bound_ms"),
                "render_ms_per_update": {"mean": round(cost["total"] / max(cost["n"], 1), 4),
                                         "max": round(cost["max"], 3), "updates": cost["n"],
                                         "total": round(cost["total"], 1)},
                "kept_up": growth["paint"] is not None and growth["paint"] < keep_up_ms,
            })
            print(json.dumps({k: results[-1][k] for k in ("tokens_per_s", "transport", "paint_lag_growth_ms",
                                                          "kept_up")}), file=sys.stderr)
            page.wait_for_timeout(300)
            if not results[-1]["kept_up"]:
                break
    page.close()
    best = {t: max((r["tokens_per_s"] for r in results if r["transport"] == t and r["kept_up"]), default=None)
            for t in transports}
    return {"markdown": markdown, "seconds_per_reply": seconds, "keep_up_if_paint_lag_grows_less_than_ms": keep_up_ms,
            "highest_rate_kept_up": best, "runs": results}


def _frame_gaps(client: dict) -> tuple[float | None, float | None]:
    """CV and longest gap between the frames that painted new text (not per word: for comparison)."""
    from .chat.perceived import gap_stats

    frames = sorted({p for p in client["shown_paint_ms"] if p is not None})
    return gap_stats(frames)


def bench_smooth(url: str, browser, prompt: str, max_tokens: int, rounds: int, settings: dict) -> dict:
    page = _open(browser, url)
    fields = page.evaluate("() => window.LAB_CONFIG.fields")
    runs = {f"{m}/{u}": [] for m, u in SMOOTH_MODES}
    index = 0
    for r in range(rounds + 1):  # round 0 warms up each mode
        for mode, unit in (SMOOTH_MODES if r % 2 == 0 else SMOOTH_MODES[::-1]):
            s = {**defaults(), "max_new_tokens": max_tokens, "temperature": 0, "kv_reuse": False,
                 "smoothing": mode, "smooth_unit": unit, **settings}
            page.evaluate("() => window.lab.clear('chat')")
            page.evaluate("(args) => window.lab.sendChat(args)", [prompt] + [s[f] for f in fields] + ["sse", 5.3])
            run = _wait_reply(page, index)
            index += 1
            if r == 0:
                continue
            row = dict(run["row"])
            row["frame_gap_cv"], row["frame_gap_max_ms"] = _frame_gaps(run["client"])
            row["tokens_per_step"] = (run["timeline"] or {}).get("tokens_per_step")
            runs[f"{mode}/{unit}"].append(row)
            page.wait_for_timeout(150)
    page.close()
    out = {"rounds": rounds, "max_tokens": max_tokens, "modes": {}}
    for name, rows in runs.items():
        out["modes"][name] = {m: _stats([row.get(m) for row in rows]) for m in SMOOTH_METRICS}
        out["modes"][name]["output_tokens"] = rows[0]["output_tokens"] if rows else None
        out["modes"][name]["tokens_per_step"] = rows[0].get("tokens_per_step") if rows else None
    return out


def bench_markdown(browser, tokens: int, rounds: int) -> dict:
    """Main-thread cost of putting a streamed reply on the page, markdown renderer vs one plain Text
    node: the paced source's markdown tokens appended one by one into a bubble styled like the page's,
    each append followed by a forced style + layout (what the next paint needs). Medians over rounds."""
    from .chat.paced import MARKDOWN

    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    origin = route_modules(page)
    page.evaluate("""async (url) => {
        document.body.innerHTML = '<div id="box" style="width:560px;white-space:pre-wrap;font:15px sans-serif"></div>';
        window.markdownModule = await import(url);
    }""", origin + PREFIX + "chat/markdown.js")
    chunks = [MARKDOWN[i % len(MARKDOWN)] for i in range(tokens)]
    script = """([chunks, markdown]) => {
        const box = document.getElementById('box');
        box.textContent = '';
        const target = markdown ? new window.markdownModule.Renderer(box) : box.appendChild(document.createTextNode(''));
        let worst = 0;
        const t0 = performance.now();
        for (const c of chunks) {
            const a = performance.now();
            target.appendData(c);
            void box.offsetHeight;  // style + layout now, as the next frame would
            worst = Math.max(worst, performance.now() - a);
        }
        return {total: performance.now() - t0, worst};
    }"""
    out = {}
    for r in range(rounds + 1):
        for markdown in ((True, False) if r % 2 else (False, True)):
            res = page.evaluate(script, [chunks, markdown])
            if r:  # round 0 warms up the JIT
                out.setdefault(markdown, []).append(res)
    page.close()
    result = {"tokens": tokens, "rounds": rounds, "chars": len("".join(chunks))}
    for markdown, runs in out.items():
        total = statistics.median(x["total"] for x in runs)
        result["markdown" if markdown else "plain"] = {
            "ms_per_reply": round(total, 2), "ms_per_token": round(total / tokens, 4),
            "worst_update_ms": round(statistics.median(x["worst"] for x in runs), 3),
            "main_thread_share_at_200_tok_s": round(total / tokens * 200 / 1000, 4)}
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ui.bench", description=__doc__.splitlines()[0])
    p.add_argument("scenario", choices=("transport", "rate", "smooth", "markdown"))
    p.add_argument("--replies", type=int, default=20, help="transport: replies per transport")
    p.add_argument("--max-tokens", type=int, default=16, help="transport: tokens per reply")
    p.add_argument("--paced-source", type=float, default=None, help="transport: a paced source instead of the model")
    p.add_argument("--rates", default="100,200,400,800,1600", type=comma_list(float), help="rate: tokens/s to try")
    p.add_argument("--seconds", type=float, default=3.0, help="rate: length of each reply")
    p.add_argument("--keep-up-ms", type=float, default=50.0, help="rate: largest paint-lag growth still 'kept up'")
    p.add_argument("--plain", action="store_true", help="rate: paint replies as plain text (no markdown rendering)")
    p.add_argument("--markdown-text", action="store_true", help="rate: the paced source streams markdown")
    p.add_argument("--transports", default=",".join(TRANSPORTS), type=comma_list(),
                   help="rate: which transports (sse,gradio)")
    p.add_argument("--rounds", type=int, default=5, help="smooth: replies per mode")
    p.add_argument("--trace", type=int, default=0, help="smooth: which recorded reply to replay")
    p.add_argument("--engine", action="store_true", help="smooth: the bundled model with speculation, not a trace")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    from engine.cli import add_load_args, load_config_from_args

    add_load_args(p)
    args = p.parse_args(argv)

    from playwright.sync_api import sync_playwright

    if args.scenario == "markdown":  # no server: the renderer alone, in Chromium
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            out = bench_markdown(browser, args.max_tokens if args.max_tokens != 16 else 600, args.rounds)
            browser.close()
        print(json.dumps(out, indent=None if args.json else 1))
        return 0

    from server.run import BackgroundServer

    from .chat.paced import PacedSource
    from .webapp import create_app

    prompt, smooth_settings = "", {}
    if args.scenario == "smooth":
        from ..shell.presets import load_prompt_sets

        prompt = load_prompt_sets()["copy_edits"]["items"][0]["turns"][0]
        if args.engine:
            smooth_settings = {"speculative": "prompt_lookup", "num_speculative_tokens": 8}
    if args.scenario == "smooth" and not args.engine:
        trace = json.loads(TRACES.read_text())["traces"][args.trace]
        engine = PacedSource(trace=trace["chunks"])
    elif args.scenario == "rate" or args.paced_source:
        engine = PacedSource(args.paced_source or 100.0, markdown=args.markdown_text)
    else:
        from engine.lab import open_engine

        engine = open_engine(load_config_from_args(args, progress=False))
    try:
        with BackgroundServer(create_app(engine)) as url, sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            if args.scenario == "transport":
                out = bench_transport(url, browser, args.replies, args.max_tokens)
                out["engine"] = engine.info().name
            elif args.scenario == "smooth":
                out = bench_smooth(url, browser, prompt, 96, args.rounds, smooth_settings)
                out["source"] = engine.info().name + ("" if args.engine else f", trace {args.trace}")
            else:
                rates = args.rates
                out = bench_rate(url, browser, engine, rates, args.seconds, args.keep_up_ms, markdown=not args.plain,
                                 transports=tuple(args.transports))
            browser.close()
    finally:
        engine.close()
    if args.json:
        print(json.dumps(out))
    elif args.scenario == "smooth":
        print(f"{out['source']}: {out['rounds']} replies per mode, medians (p50)")
        for name, m in out["modes"].items():
            print(f"  {name:>13}: word-gap CV {m['paint_gap_cv'].get('p50')}, longest stall "
                  f"{m['paint_gap_max_ms'].get('p50')} ms | frame-gap CV {m['frame_gap_cv'].get('p50')}, longest "
                  f"frame gap {m['frame_gap_max_ms'].get('p50')} ms | hold {m['smoothing_hold_ms'].get('p50')} ms, "
                  f"first word {m['client_first_word_ms'].get('p50')} ms, last paint {m['client_e2e_ms'].get('p50')} ms")
    else:
        print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
