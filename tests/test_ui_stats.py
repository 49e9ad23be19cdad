"""A/B that decides: paired intervals (ui/compare/stats.py), the replies check (ui/compare/replies.py) and the
verdict sentence (ui/compare/verdict.py), on made-up figures and through a sweep of the paced source."""

from __future__ import annotations

import asyncio
import csv
import json
import math
import random

import pytest

from engine.core.config import SAMPLING, TOGGLES
from ui.compare import replies, stats, sweep, verdict
from ui.chat.store import ChatStore
from ui.shell.glossary import METRICS
from ui.chat.paced import PacedSource
from ui.chat.settings import PAGE_SETTINGS


def rows_of(a: list[float], b: list[float], metric: str = "ttft_ms", orders: list[str] | None = None) -> list[dict]:
    out = []
    for i, (x, y) in enumerate(zip(a, b), start=1):
        o = orders[i - 1] if orders else stats.pair_order(i - 1)
        out += [{"item": i, "turn": 1, "pane": "A", metric: x, "order": o},
                {"item": i, "turn": 1, "pane": "B", metric: y, "order": o}]
    return out


def noisy(n: int, ratio: float, spread: float, seed: int = 1):
    rng = random.Random(seed)
    a = [100 * rng.uniform(0.8, 1.2) for _ in range(n)]
    return a, [x * ratio * rng.uniform(1 - spread, 1 + spread) for x in a]


def test_a_clear_cut_gets_a_winner_and_an_interval_around_the_ratio():
    a, b = noisy(8, 0.42, 0.05)
    p = stats.paired_table(rows_of(a, b))[0]
    assert p.metric == "ttft_ms" and p.n == 8 and p.winner == "B" and p.decided and p.decision == "winner"
    assert p.lo < p.ratio < p.hi < 1 and p.method == "t" and p.orders == "4 AB, 4 BA"
    geomean = math.exp(sum(math.log(y / x) for x, y in zip(a, b)) / 8)
    assert p.ratio == pytest.approx(geomean, rel=0.02)  # balanced orders: the order-adjusted mean is the mean


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


def test_items_pair_by_item_and_turn_and_missing_zero_or_warmup_values_drop_out():
    rows = rows_of([10, 20, 30], [5, 10, 15]) + [{"item": 9, "turn": 1, "pane": "A", "ttft_ms": 7}]
    rows[0]["ttft_ms"] = None
    rows += [{"item": 0, "turn": 1, "pane": p, "ttft_ms": 99, "warmup": True} for p in "AB"]
    a, b, orders = stats.paired_values(rows, "ttft_ms")
    assert (a, b, orders) == ([20.0, 30.0], [10.0, 15.0], ["BA", "BA"])
    assert stats.paired_values(rows_of([0, 1], [0, 2]), "ttft_ms")[:2] == ([1.0], [2.0])
    two = stats.paired_ratio("ttft_ms", [10.0, 12.0], [5.0, 6.0])
    assert two.ratio == pytest.approx(0.5) and two.lo is None and two.decision == "too few"
    assert stats.decision_text(two) == f"too few items to decide (n = 2; needs {stats.MIN_ITEMS})"


def test_the_interval_is_the_order_adjusted_t_interval_at_every_size():
    for n in (3, 8, 60):
        a, b = noisy(n, 0.9, 0.1, seed=n)
        assert stats.paired_table(rows_of(a, b))[0].method == "t", n
    # by hand: order-adjusted mean of log(B/A), df = n − 2, the variance pooled within the two orders
    a, b = noisy(6, 0.9, 0.1, seed=4)
    d = [math.log(y / x) for x, y in zip(a, b)]
    orders = [stats.pair_order(i) for i in range(6)]
    groups = [[x for x, o in zip(d, orders) if o == k] for k in ("AB", "BA")]
    means = [sum(g) / len(g) for g in groups]
    s2 = sum((x - m) ** 2 for g, m in zip(groups, means) for x in g) / 4
    se = math.sqrt(s2 / 4 * (1 / 3 + 1 / 3))
    from scipy import stats as sps
    q = sps.t.ppf(0.975, 4)
    e = stats.estimate(d, orders)
    assert (e.lo, e.hi) == pytest.approx((sum(means) / 2 - q * se, sum(means) / 2 + q * se))
    assert e.p == pytest.approx(2 * sps.t.sf(abs(sum(means) / 2) / se, 4))
    assert e.order_effect == pytest.approx((means[0] - means[1]) / 2)
    # one order only (the Load tab): the plain one-sample t, df = n − 1
    one = stats.estimate(d, ["AB"] * 6)
    m, sd = sum(d) / 6, math.sqrt(sum((x - sum(d) / 6) ** 2 for x in d) / 5)
    assert (one.lo, one.hi) == pytest.approx((m - sps.t.ppf(0.975, 5) * sd / math.sqrt(6),
                                              m + sps.t.ppf(0.975, 5) * sd / math.sqrt(6)))
    assert one.order_effect is None


def test_an_interval_bound_near_1_keeps_the_side_of_1_it_is_on():
    def shown(lo, hi):
        return stats.interval_text(stats.PairedRatio("e2e_ms", 8, 1.1, lo, hi, None, None))

    assert shown(1.0031, 1.2412) == "1.003–1.24"  # excludes 1: not shown as 1.00
    assert shown(0.8, 0.99962) == "0.80–0.9996"
    assert shown(0.95, 1.0) == "0.95–1.00"  # 1 itself stays 1.00
    assert shown(0.987, 1.123) == "0.99–1.12"  # far from 1: two decimals


def test_holm_matches_the_step_down_by_hand():
    assert stats.holm([0.01, 0.04, None, 0.03, 0.005]) == pytest.approx([0.03, 0.06, None, 0.06, 0.02])
    assert stats.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])


def test_a_difference_inside_the_floors_is_no_practical_difference():
    # B 1% faster, very tightly: the interval excludes 1, but 1% is under the 2% floor
    a = [100.0 + 10 * i for i in range(12)]
    b = [x * 0.99 * (1 + 0.001 * (-1) ** i) for i, x in enumerate(a)]
    p = stats.paired_table(rows_of(a, b))[0]
    assert p.hi < 1 and p.decided and p.winner is None and p.decision == "no practical difference"
    assert stats.decision_text(p) == "no practical difference (inside 2% / 1 ms)"
    # queue 0.3 ms against 0.4 ms (issue 44): a third more, but a tenth of a millisecond
    qa = [0.3 * (1 + 0.01 * (i % 3)) for i in range(12)]
    qb = [x * 4 / 3 for x in qa]
    q = stats.paired_table(rows_of(qa, qb, "queue_ms"), ["queue_ms"])[0]
    assert q.lo > 1.2 and q.decision == "no practical difference" and q.winner is None
    assert stats.beyond_floors("ttft_ms", 100.0, 97.0) and not stats.beyond_floors("ttft_ms", 100.0, 98.5)
    assert not stats.beyond_floors("queue_ms", 0.3, 0.4) and stats.beyond_floors("cached_tokens", 0, 1)


def test_every_metric_declares_its_floors_once_with_the_metrics():
    assert METRICS["ttft_ms"].floors == (0.02, 1.0) and METRICS["decode_tps"].floors == (0.02, 1.0)
    assert METRICS["acceptance_rate"].floors == (0.02, 0.01)
    assert {m for m, d in METRICS.items() if d.headline} == set(verdict.HEADLINE) == {"ttft_ms", "tpot_ms", "e2e_ms"}


def test_the_correction_can_withhold_a_winner_that_one_metric_alone_would_get():
    rng = random.Random(7)
    a = [100 * rng.uniform(0.8, 1.2) for _ in range(8)]
    shift = [0.93, 1.02, 0.95, 0.99, 0.94, 1.01, 0.96, 0.97]  # about 4% lower, noisily
    rows = rows_of(a, [x * s for x, s in zip(a, shift)])
    alone = stats.paired_table(rows, ["ttft_ms"])[0]
    assert alone.p <= stats.ALPHA and alone.winner == "B"
    for r in rows:  # six more metrics, none of which moves
        for m in ("tpot_ms", "e2e_ms", "prefill_ms", "queue_ms", "decode_tps", "output_tokens"):
            r[m] = 50 * (1 + 0.2 * rng.random())
    table = stats.paired_table(rows)
    ttft = next(p for p in table if p.metric == "ttft_ms")
    assert ttft.p == alone.p and ttft.p_holm > stats.ALPHA and ttft.winner is None
    assert stats.decision_text(ttft).startswith("no difference detected after correction (n = 8; Holm p = ")


def test_items_to_detect_grows_with_the_spread_and_the_correction():
    n_tight, n_wide = stats.items_to_detect(0.02), stats.items_to_detect(0.2)
    assert stats.MIN_ITEMS <= n_tight < n_wide
    assert stats.items_to_detect(0.2, alpha=0.05 / 7) > n_wide
    # the normal approximation (z 1.96 + 0.84) is a lower bound of the exact t-test's n
    assert n_wide >= math.ceil(((1.959964 + 0.841621) * 0.2 / math.log(1.05)) ** 2)
    assert stats.items_to_detect(None) is None


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


def test_the_verdict_names_the_headline_metrics_from_their_decisions():
    a, b = noisy(20, 0.42, 0.05)
    ta, tb = noisy(20, 1.0, 0.1, seed=5)
    rows = rows_of(a, b)
    for r, v in zip(rows, [x for pair in zip(ta, tb) for x in pair]):
        r["tpot_ms"] = v
        r["queue_ms"] = 0.3 if r["pane"] == "A" else 0.1  # decided, but under a millisecond: not named anyway
    table = stats.paired_table(rows)
    same = replies.summarize([(i, {"token_ids": [1]}, {"token_ids": [1]}) for i in range(20)],
                             {"temperature": 0}, {"temperature": 0, "kv_reuse": False})
    text = verdict.verdict(table, same)
    ttft, tpot = (next(p for p in table if p.metric == m) for m in ("ttft_ms", "tpot_ms"))
    assert text == (f"B cuts TTFT (server) to {ttft.ratio:.2f}x ({ttft.lo:.2f}–{ttft.hi:.2f}); no difference "
                    f"detected in TPOT ({tpot.lo:.2f}–{tpot.hi:.2f}); 20 items, order counterbalanced; "
                    "20 of 20 replies identical.")
    assert "queue" not in text
    few = verdict.verdict(stats.paired_table(rows_of([1.0, 2.0], [1.0, 2.0])))
    assert few == f"Too few items to decide on TTFT (server) (needs {stats.MIN_ITEMS}); 2 items, order counterbalanced."


def test_every_new_term_is_in_the_glossary():
    for name in ("ab_ratio", "ab_ratio_ci", "ab_p_holm", "ab_decision", "items_to_detect_5pct", "identical_replies",
                 "token_agreement", "identical_rate", "practical_floor", "holm_correction", "order_counterbalanced",
                 "warmup_pair", "aa_check"):
        assert METRICS[name].end


def test_a_sweep_runs_a_warmup_then_counterbalanced_items_and_exports_the_order(tmp_path):
    store = ChatStore(PacedSource(2000.0))
    items = {"items": [{"turns": [f"prompt {i}"]} for i in range(4)]}
    rows = asyncio.run(sweep.run_sweep(store, items, {"max_new_tokens": 3, "temperature": 0},
                                       {"max_new_tokens": 3, "temperature": 0, "kv_reuse": False}))
    assert [(r["item"], r["pane"], r["order"], r["position"], bool(r.get("warmup"))) for r in rows] == [
        (0, "A", "AB", 1, True), (0, "B", "AB", 2, True),
        (1, "A", "AB", 1, False), (1, "B", "AB", 2, False), (2, "B", "BA", 1, False), (2, "A", "BA", 2, False),
        (3, "B", "BA", 1, False), (3, "A", "BA", 2, False), (4, "A", "AB", 1, False), (4, "B", "AB", 2, False)]
    rep = sweep.report(rows)
    assert rep["replies"]["n"] == 4 and rep["replies"]["kind"] == "lossless"
    assert {p["metric"] for p in rep["paired"]} >= {"ttft_ms", "output_tokens"} and rep["aa"] is False
    assert all(p["n"] == 4 and p["orders"] == "2 AB, 2 BA" for p in rep["paired"])  # the warm-up is not counted
    assert rep["design"] == {"order": "ABBA", "warmup_pairs": 1, "items": 4}
    assert rep["decision"]["alpha"] == stats.ALPHA and rep["decision"]["correction"] == "holm"
    assert rep["decision"]["floors"]["ttft_ms"] == {"relative": 0.02, "absolute": 1.0}
    assert rep["verdict"].endswith("4 items, order counterbalanced; 4 of 4 replies identical.")
    assert all("winner" not in s for s in rep["summary"])
    page = sweep.summary_html(rows)
    assert 'class="lab-verdict"' in page and 'class="lab-ci"' in page and "Holm" in page and "warm-up" in page
    csv_path, json_path = sweep.export_files(rows, tmp_path)
    exported = list(csv.DictReader(open(csv_path)))
    assert [(r["item"], r["pane"], r["order"], r["warmup"]) for r in exported[:4]] == [
        ("0", "A", "AB", "True"), ("0", "B", "AB", "True"), ("1", "A", "AB", ""), ("1", "B", "AB", "")]
    assert json.loads(open(json_path).read())["design"]["order"] == "ABBA"


def test_a_sweep_with_the_same_server_settings_is_an_aa_check():
    assert sweep.same_on_server({"temperature": 0, "network": "loopback"}, {"temperature": 0, "network": "4g"})
    assert not sweep.same_on_server({"temperature": 0}, {"temperature": 0, "kv_reuse": False})
    store = ChatStore(PacedSource(2000.0))
    items = {"items": [{"turns": [f"prompt {i}"]} for i in range(3)]}
    rows = asyncio.run(sweep.run_sweep(store, items, {"max_new_tokens": 3, "temperature": 0, "network": "loopback"},
                                       {"max_new_tokens": 3, "temperature": 0, "network": "4g"}))
    assert sweep.report(rows)["aa"] is True and "A/A check" in sweep.summary_html(rows)


def test_repeated_ab_runs_of_one_prompt_pair_up_after_a_warmup_in_their_order():
    from ui.compare import repeated as ab_stats

    store = ChatStore(PacedSource(2000.0))
    s = store.new_session()
    a_set, b_set = {"max_new_tokens": 3, "temperature": 0}, {"max_new_tokens": 3, "temperature": 0, "kv_reuse": False}
    sets = {"A": a_set, "B": b_set}

    async def turn(pane, prompt):
        async for kind, data in store.run_turn(s, pane, prompt, sets[pane]):
            if kind == "done":
                return data

    async def runs():
        await turn("A", "other prompt")
        await turn("B", "other prompt")
        for k in range(5):  # the warm-up A first, then AB, BA, BA, AB as the page runs them
            first = "AB" if k < stats.WARMUP_PAIRS else stats.pair_order(k - stats.WARMUP_PAIRS)
            for pane in first:
                await turn(pane, "the prompt")

    asyncio.run(runs())
    a, b = store.replies(s, "A")[-1], store.replies(s, "B")[-1]
    rep = ab_stats.repeated_report(store, s, a, b)
    assert rep["runs"] == 5 and rep["counted"] == 4 and rep["replies"].n == 4 and rep["replies"].identical == 4
    assert [r["order"] for r in rep["rows"] if r["pane"] == "A"] == ["AB", "AB", "BA", "BA", "AB"]
    assert {p.metric for p in rep["paired"]} >= {"ttft_ms", "tpot_ms"} and all(p.n == 4 for p in rep["paired"])
    assert rep["verdict"].endswith("4 items, order counterbalanced; 4 of 4 replies identical.")
    assert store.token_ids(s, a) is not None
    assert "Over 5 runs of this prompt (the first a warm-up, not counted)" in ab_stats.repeated_html(store, s, a, b)
    first = store.replies(s, "A")[0], store.replies(s, "B")[0]
    assert "run the same prompt again" in ab_stats.repeated_html(store, s, *first)
