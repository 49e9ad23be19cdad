"""The two teaching presets of the network stages, run from their buttons: streaming off costs the
reader the whole reply; a simulated 4G link adds about one round trip to the browser's TTFT while
the server's figures stay the engine's."""

from ui.chat.network import PRESETS

from .test_ui_page import last_run, open_page


def run_preset(page, name):
    page.evaluate("() => { const d = document.querySelector('#lab-delta'); d.dataset.seen = d.innerHTML; }")
    page.click(f"#lab-preset-{name}")
    page.wait_for_function("() => { const d = document.querySelector('#lab-delta'); "
                           "return d.querySelector('table') && d.innerHTML !== d.dataset.seen; }", timeout=300_000)
    a, b = last_run(page, "A"), last_run(page, "B")
    assert a["error"] is None and b["error"] is None
    return a["row"], b["row"], page.inner_text("#lab-delta")


def test_streaming_off_shows_the_first_word_only_at_the_total(page_server, browser_page):
    page = browser_page
    open_page(page, page_server)
    page.click("button[role=tab]:has-text('A/B')")
    a, b, delta = run_preset(page, "streaming")
    assert a["output_tokens"] > 8 and b["output_tokens"] > 8
    assert a["client_ttft_ms"] < a["e2e_ms"]  # streamed: the first word came before the end
    assert b["client_ttft_ms"] >= b["e2e_ms"]  # not streamed: nothing painted before the server was done
    assert b["client_first_word_ms"] >= b["e2e_ms"]
    assert "not streamed" in b["config"] and "waited for the whole reply" in delta


def test_a_simulated_4g_link_adds_one_round_trip_to_the_browser_ttft_only(page_server, browser_page):
    page = browser_page
    open_page(page, page_server)
    page.click("button[role=tab]:has-text('A/B')")
    link = PRESETS["4g"]
    runs = [run_preset(page, "network") for _ in range(3)]
    # Noise on a loopback page only ever adds time, so the quietest of three runs per pane is compared:
    # B minus A, each as browser TTFT minus server TTFT, is the simulated round trip within its jitter.
    quiet_a = min(a["transport_overhead_ms"] for a, _, _ in runs)
    quiet_b = min(b["transport_overhead_ms"] for _, b, _ in runs)
    added = quiet_b - quiet_a
    low, high = 2 * (link.delay_ms - link.jitter_ms), 2 * (link.delay_ms + link.jitter_ms)
    assert low - 30 <= added <= high + 60, (added, [(a["transport_overhead_ms"], b["transport_overhead_ms"])
                                                    for a, b, _ in runs])
    a, b, delta = runs[-1]
    assert b["network_in_ms"] is None or b["network_in_ms"] >= link.delay_ms - link.jitter_ms - 10
    assert "network 4g" in b["config"] and "B's network adds" in delta
