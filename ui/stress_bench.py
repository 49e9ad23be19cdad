"""`python -m ui.stress_bench`: this browser's paint limit from the command line. Starts the app on
the paced test source on a free loopback port, opens the page in headless Chromium, runs the Chat tab's
stress run (ui/chat/stress.js: the long markdown reply at each rate) and prints its figures per rate and
its sentence. The same run as the page's button; figures for docs/ go here, never into code.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from engine.cli import comma_list

from .chat.stress import RATES

CHROMIUM = os.environ.get("LATENCY_LAB_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
SHOWN = ("rate", "tokens", "lag_p50_ms", "lag_p99_ms", "lag_growth_ms", "long_tasks", "long_task_ms", "markdown_ms",
         "dom_ms", "overlay_ms", "layout_ms", "markdown_ms_per_chunk", "dom_ms_per_chunk", "cost_growth", "frames",
         "dropped_frames", "behind")


def stress(rates: list[float]) -> dict:
    from playwright.sync_api import sync_playwright

    from server.run import BackgroundServer
    from ui.webapp import create_app

    from .chat.paced import PacedSource

    source = PacedSource(200)
    try:
        with BackgroundServer(create_app(source)) as url, sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url)
            page.wait_for_function("() => window.lab && window.lab.session && window.lab.clock.offset !== null",
                                   timeout=60_000)
            page.set_default_timeout(600_000)
            out = page.evaluate("(rates) => window.lab.stress(rates)", rates)
            browser.close()
    finally:
        source.close()
    return {"rows": [{k: r.get(k) for k in SHOWN} for r in out["rows"]], "verdict": out.get("verdict"),
            "error": out.get("error")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ui.stress_bench", description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default=",".join(str(r) for r in RATES), type=comma_list(float),
                    help="tok/s, comma-separated")
    ap.add_argument("--json", action="store_true", help="one JSON object")
    args = ap.parse_args(argv)
    rates = args.rates
    out = stress(rates)
    if args.json:
        print(json.dumps(out))
    else:
        for r in out["rows"]:
            print("  ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))
        print(out["verdict"] or out["error"])
    return 1 if out["error"] else 0


if __name__ == "__main__":
    sys.exit(main())
