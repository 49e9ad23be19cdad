"""The Trace download in a real browser: under an A/B reply, one file with both panes on one timeline —
browser, network and server tracks each — whose server intervals are the replies' Timelines."""

import json

import pytest
from test_trace import check_well_formed, slices

from .test_ui_page import open_ab, run_ab

DONE = "() => ['A', 'B'].every(p => { const r = window.lab.panes[p].runs.at(-1); return r && r.client; })"


def test_an_ab_pairs_trace_holds_both_panes(page_server, browser_page, artifacts):
    page = browser_page
    open_ab(page, page_server, 6)
    run_ab(page, "Name a fruit.")
    page.wait_for_function(DONE, timeout=60_000)
    link = page.locator("#lab-log-A .lab-msg.assistant:last-child .lab-trace a")
    assert link.inner_text() == "Trace"
    with page.expect_download() as download:
        link.click()
    path = artifacts / "trace-ab.json"  # open it in ui.perfetto.dev
    download.value.save_as(path)
    trace = json.loads(path.read_text())
    check_well_formed(trace)
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert names == {f"{p} · {t}" for p in "AB" for t in ("browser", "network", "server")}
    runs = page.evaluate("""() => ['A', 'B'].map(p => { const r = window.lab.panes[p].runs.at(-1);
        return {id: r.requestId, tl: r.record.timeline}; })""")
    assert [r["request_id"] for r in trace["otherData"]["replies"]] == [r["id"] for r in runs]
    pids = {e["args"]["name"]: e["pid"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    for pane, run in zip("AB", runs):
        tl = run["tl"]
        (decode,) = [e for e in slices(trace, "decode") if e["pid"] == pids[f"{pane} · server"]]
        assert decode["dur"] == pytest.approx((tl["token_ms"][-1] - tl["token_ms"][0]) * 1e3, abs=1e-3)
        browser = {e["name"] for e in trace["traceEvents"] if e["pid"] == pids[f"{pane} · browser"]}
        assert {"send (key press)", "response headers", "first bytes", "first chunk arrived", "paint",
                "reply: send → last paint"} <= browser
        (net_in,) = [e for e in slices(trace, "network in") if e["pid"] == pids[f"{pane} · network"]]
        assert net_in["args"]["clock_bound_ms"] is not None
