"""`latency-lab report`'s report.html opens in a browser with the network off: one file, its plots
drawn inline, nothing fetched (engine/bench/report_render.py `html_page`)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_report import REPORT  # noqa: E402

from engine.bench import report_render  # noqa: E402


def test_report_html_opens_offline_with_its_plots(chromium, tmp_path):
    report_render.write(tmp_path, REPORT)
    context = chromium.new_context(offline=True)
    try:
        page = context.new_page()
        requested = []
        page.on("request", lambda r: requested.append(r.url))
        page.goto((tmp_path / "report.html").as_uri())
        assert page.title() == "Latency Lab report, 2026-12-03"
        assert page.locator("figure svg").count() == len(report_render.plots(REPORT)) == 2
        box = page.locator("figure svg").first.bounding_box()
        assert box["width"] > 300 and box["height"] > 50  # drawn, not an empty box
        assert "61% of read bandwidth" in page.locator("figure").nth(1).inner_text()
        assert page.locator("table tr").count() == 1 + len(REPORT["steps"])
        assert requested == [(tmp_path / "report.html").as_uri()]  # the file itself, nothing else
    finally:
        context.close()
