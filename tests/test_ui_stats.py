"""A/B that decides: paired intervals (ui/stats.py), the replies check (ui/replies.py) and the
verdict sentence (ui/verdict.py), on made-up figures and through a sweep of the paced source."""

from __future__ import annotations

import asyncio
import math
import random

import pytest

from engine.core.config import SAMPLING, TOGGLES
from ui import replies, stats, sweep, verdict
from ui.chat import ChatStore
from ui.glossary import METRICS
from ui.paced import PacedSource
from ui.settings import PAGE_SETTINGS


def rows_of(a: list[float], b: list[float], metric: str = "ttft_ms") -> list[dict]:
    out = []
    for i, (x, y) in enumerate(zip(a, b), start=1):
        out += [{"item": i, "turn": 1, "pane": "A", metric: x}, {"item": i, "turn": 1, "pane": "B", metric: y}]
    return out


def noisy(n: int, ratio: float, spread: float, seed: int = 1):
    rng = random.Random(seed)
    a = [100 * rng.uniform(0.8, 1.2) for _ in range(n)]
    return a, [x * ratio * rng.uniform(1 - spread, 1 + spread) for x in a]


def test_a_clear_cut_gets_a_winner_and_an_interval_around_the_ratio():
    a, b = noisy(8, 0.42, 0.05)
    p = stats.paired_table(rows_of(a, b))[0]
    assert p.metric == "ttft_ms" and p.n == 8 and p.winner == "B" and p.decided
    assert p.lo < p.ratio < p.hi < 1
    assert p.ratio == pytest.approx(sorted(b)[3:5][0] / sorted(a)[3:5][0], rel=0.2)


def test_noise_alone_gets_no_winner_and_says_so_with_n():
    a, b = noisy(8, 1.0, 0.15)
    p = stats.paired_table(rows_of(a, b))[0]
    assert p.lo < 1 < p.hi and p.winner is None
    assert stats.decision_text(p) == "no difference detected (n = 8)"


def test_the_same_figures_give_the_same_interval():
    a, b = noisy(10, 0.9, 0.1)
    assert stats.paired_table(rows_of(a, b)) == stats.paired_table(rows_of(a, b))


def test_a_higher_is_better_metric_picks_the_higher_side():
    a, b = noisy(8, 1.5, 0.05)
    p = stats.paired_table(rows_of(a, b, "decode_tps"), ["decode_tps"])[0]
    assert p.winner == "B" and p.lo > 1
    p = stats.paired_table(rows_of(b, a, "decode_tps"), ["decode_tps"])[0]
    assert p.winner == "A" and p.hi < 1


def test_items_pair_by_item_and_turn_and_missing_or_zero_values_drop_out():
    rows = rows_of([10, 20, 30], [5, 10, 15]) + [{"item": 9, "turn": 1, "pane": "A", "ttft_ms": 7}]
    rows[0]["ttft_ms"] = None
    a, b = stats.paired_values(rows, "ttft_ms")
    assert (a, b) == ([20.0, 30.0], [10.0, 15.0])
    assert stats.paired_values(rows_of([0, 1], [0, 2]), "ttft_ms") == ([1.0], [2.0])
    one = stats.paired_ratio("ttft_ms", [10.0], [5.0])
    assert one.ratio == 0.5 and one.lo is None and "at least 2" in stats.decision_text(one)


def test_items_to_detect_grows_with_the_spread_and_matches_the_t_test_power():
    rng = random.Random(3)
    tight = [rng.gauss(0, 0.02) for _ in range(20)]
    wide = [rng.gauss(0, 0.2) for _ in range(20)]
    n_tight, n_wide = stats.items_to_detect(tight), stats.items_to_detect(wide)
    assert 2 <= n_tight < n_wide
    # the normal approximation (z 1.96 + 0.84) is a lower bound of the exact t-test's n
    import statistics

    sd = statistics.stdev(wide)
    assert n_wide >= math.ceil(((1.959964 + 0.841621) * sd / math.log(1.05)) ** 2)
    assert stats.items_to_detect([0.1]) is None


def test_lossless_derives_from_the_toggle_declarations():
    lossless = {t.name for t in (*TOGGLES, *PAGE_SETTINGS) if t.keeps_reply}
    assert {"kv_reuse", "speculative", "chunked_prefill", "compiled_decode"} <= lossless
    assert "quantization" not in lossless and not any(t.keeps_reply for t in SAMPLING)
    greedy = {"temperature": 0}
    assert replies.pair_kind(greedy, {**greedy, "kv_reuse": False}) == ("lossless", ["kv_reuse"])
    assert replies.pair_kind(greedy, {**greedy, "quantization": "int8wo"})[0] == "lossy"
    assert replies.pair_kind(greedy, {"temperature": 0.7})[0] == "sampled"
    assert replies.pair_kind(greedy, {**greedy, "system": "Be brief."}) == ("lossy", ["system"])
    assert replies.pair_kind({**greedy, "backend": "local"}, {**greedy, "backend": "openai"})[0] == "lossy"


def test_replies_count_identical_ones_and_name_the_first_differing_token():
    pairs = [(1, {"token_ids": [1, 2, 3]}, {"token_ids": [1, 2, 3]}),
             (2, {"token_ids": [1, 2, 3, 4]}, {"token_ids": [1, 2, 9, 9]})]
    s = replies.summarize(pairs, {"temperature": 0}, {"temperature": 0, "speculative": "prompt_lookup"},
                          decode=lambda ids: f"<{ids[0]}>")
    assert (s.kind, s.n, s.identical) == ("lossless", 2, 1)
    assert s.first_different.first_diff == 2 and s.token_agreement == pytest.approx(5 / 7)
    assert replies.sentence(s) == "1 of 2 replies identical; item 2 parts at token 3 (A '<3>', B '<9>')"
    lossy = replies.summarize(pairs, {"temperature": 0}, {"temperature": 0, "quantization": "nf4"})
    assert replies.sentence(lossy).startswith("token agreement with A 71%, 1 of 2 replies identical")


def test_the_verdict_is_built_from_the_intervals_and_the_replies():
    a, b = noisy(20, 0.42, 0.05)
    ta, tb = noisy(20, 1.0, 0.1, seed=5)
    rows = rows_of(a, b)
    for r, v in zip(rows, [x for pair in zip(ta, tb) for x in pair]):
        r["tpot_ms"] = v
    table = stats.paired_table(rows)
    same = replies.summarize([(i, {"token_ids": [1]}, {"token_ids": [1]}) for i in range(20)],
                             {"temperature": 0}, {"temperature": 0, "kv_reuse": False})
    text = verdict.verdict(table, same)
    ttft, tpot = (next(p for p in table if p.metric == m) for m in ("ttft_ms", "tpot_ms"))
    assert text.startswith(f"B cuts TTFT (server) to {ttft.ratio:.2f}x ({ttft.lo:.2f}–{ttft.hi:.2f}, 20 items)")
    assert f"shows no difference in TPOT ({tpot.lo:.2f}–{tpot.hi:.2f}" in text
    assert text.endswith("; 20 of 20 replies identical.")


def test_every_new_figure_is_in_the_glossary():
    for name in ("ab_ratio", "ab_ratio_ci", "ab_decision", "items_to_detect_5pct", "identical_replies",
                 "token_agreement", "identical_rate"):
        assert METRICS[name].end


def test_a_sweep_reports_intervals_replies_and_a_verdict():
    store = ChatStore(PacedSource(2000.0))
    items = {"items": [{"turns": [f"prompt {i}"]} for i in range(4)]}
    rows = asyncio.run(sweep.run_sweep(store, items, {"max_new_tokens": 3, "temperature": 0},
                                       {"max_new_tokens": 3, "temperature": 0, "kv_reuse": False}))
    rep = sweep.report(rows)
    assert rep["replies"]["n"] == 4 and rep["replies"]["kind"] == "lossless"
    assert {p["metric"] for p in rep["paired"]} >= {"ttft_ms", "output_tokens"}
    assert rep["verdict"].startswith("B ") and "replies identical" in rep["verdict"]
    assert all("winner" not in s for s in rep["summary"])
    page = sweep.summary_html(rows)
    assert 'class="lab-verdict"' in page and 'class="lab-ci"' in page


def test_repeated_ab_runs_of_one_prompt_pair_up_with_their_intervals():
    from ui import ab_stats

    store = ChatStore(PacedSource(2000.0))
    s = store.new_session()
    a_set, b_set = {"max_new_tokens": 3, "temperature": 0}, {"max_new_tokens": 3, "temperature": 0, "kv_reuse": False}

    async def turn(pane, prompt, settings):
        async for kind, data in store.run_turn(s, pane, prompt, settings):
            if kind == "done":
                return data

    async def runs():
        await turn("A", "other prompt", a_set)
        await turn("B", "other prompt", b_set)
        for _ in range(3):
            await turn("A", "the prompt", a_set)
            await turn("B", "the prompt", b_set)

    asyncio.run(runs())
    a, b = store.replies(s, "A")[-1], store.replies(s, "B")[-1]
    rep = ab_stats.repeated_report(store, s, a, b)
    assert rep["runs"] == 3 and rep["replies"].n == 3 and rep["replies"].identical == 3
    assert {p.metric for p in rep["paired"]} >= {"ttft_ms", "tpot_ms"} and all(p.n == 3 for p in rep["paired"])
    assert rep["verdict"].startswith("B ") and rep["verdict"].endswith("3 of 3 replies identical.")
    assert ab_stats.token_ids(store, s, a) is not None
    assert "Over 3 runs of this prompt" in ab_stats.repeated_html(store, s, a, b)
    first = store.replies(s, "A")[0], store.replies(s, "B")[0]
    assert "run the same prompt again" in ab_stats.repeated_html(store, s, *first)
