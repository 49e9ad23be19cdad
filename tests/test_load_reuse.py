"""KV reuse under load (server/load/reuse.py): conversations of N turns with think time between them,
the prefix cache's budget as a knob of the run, and per level its hit rate, evictions and follow-up
turns against first turns; one sentence names where reuse collapses. The judge stays: every reply is
still checked against the same request alone. The load runs use the tiny random model."""

import numpy as np
import pytest
from kv_support import filled_kv

from engine.serving.prefix_cache import PrefixCache
from engine.serving.service import Engine
from server.api import create_api
from server.load.drive import MemorySampler, run_load
from server.load.pool import Result, build_pool, compute_references
from server.load.reuse import (
    DISTRIBUTIONS,
    ThinkTime,
    collapse_sentence,
    kv_budget,
    reuse_figures,
    reuse_table,
)
from server.run import BackgroundServer


@pytest.mark.parametrize("dist", DISTRIBUTIONS)
def test_think_times_keep_their_mean_and_their_seed(dist):
    think = ThinkTime(2.0, dist, seed=7)
    rng = think.rng(1)
    draws = [think.draw(rng) for _ in range(4000)]
    assert np.mean(draws) == pytest.approx(2.0, rel=0.1) and min(draws) >= 0
    again, other = think.rng(1), think.rng(2)
    assert [think.draw(again) for _ in range(5)] == draws[:5]  # the same seed and client, the same gaps
    if dist == "constant":
        assert set(draws) == {2.0}
    else:
        assert np.std(draws) > 0.3 and [think.draw(other) for _ in range(5)] != draws[:5]


def test_bad_think_times_are_refused():
    with pytest.raises(ValueError, match="distribution"):
        ThinkTime(1.0, "gaussian")
    with pytest.raises(ValueError, match="seconds"):
        ThinkTime(-1.0)


def test_conversations_of_n_turns_and_the_reuse_only_pool():
    pool = build_pool(3, 8, {"speculative": "prompt_lookup", "quantization": "int8wo"}, turns=5, reuse_only=True)
    assert [len(c.turns) for c in pool] == [5, 5, 5]
    assert all(c.with_session and t.body["kv_reuse"] and t.body["temperature"] == 0.0 and "speculative" not in t.body
               for c in pool for t in c.turns)
    assert [t.key for t in pool[1].turns] == [f"c1t{j}" for j in range(1, 6)]
    mixed = build_pool(4, 8, {}, turns=1)
    assert [len(c.turns) for c in mixed] == [1] * 4 and not mixed[1].turns[0].body["kv_reuse"]


def test_set_budget_evicts_the_least_recently_used_and_gives_the_old_one_back():
    kv = filled_kv(16)
    size = kv.k.untyped_storage().nbytes() * 2
    cache = PrefixCache(budget_mb=10 * size / 2**20)
    for i in range(4):
        assert cache.insert("m", f"session:{i}", list(range(i * 100, i * 100 + 16)), filled_kv(16))
    cache.lookup("m", "session:0", list(range(16))).release()  # session 0 used last but for the inserts
    old = cache.set_budget(2.5 * size / 2**20, "test")
    assert old[1].endswith("given in code")
    held = {e.scope for e in cache.entries()}
    assert held == {"session:0", "session:3"} and cache.stats()["evictions"] == 2
    assert cache.stats()["bytes"] <= cache.budget_bytes
    cache.set_budget(*old)
    assert cache.budget_bytes == int(10 * size)


def done_result(key, ttft, cached, prefill):
    return Result(key, 1, outcome="exact", timings={"ttft_ms": ttft, "cached_tokens": cached,
                                                   "prefill_tokens": prefill})


def test_reuse_figures_count_follow_ups_that_kept_their_history():
    pool = build_pool(2, 8, {}, turns=3)  # c0: reuse + session; c1: reuse off (not counted)
    for conv in pool:
        for i, t in enumerate(conv.turns):
            t.ref_prompt_tokens = 30 + 20 * i
    results = [done_result("c0t1", 100, 10, 20), done_result("c0t2", 110, 29, 21),  # kept turn 1's prompt
               done_result("c0t3", 300, 10, 60),  # evicted: only the shared preamble
               done_result("c1t2", 999, 0, 50)]
    f = reuse_figures(results, pool)
    assert f["follow_ups"] == 2 and f["follow_up_reuse_rate"] == 0.5
    assert f["first_turn_ttft_ms_p50"] == 100 and f["follow_up_ttft_ms_p50"] == 205
    assert f["follow_up_ttft_ratio"] == 2.05 and f["follow_up_prefill_tokens_p50"] == 40.5


def test_the_sentence_names_where_reuse_collapses_per_budget():
    def row(mb, clients, rate, ratio=1.0):
        return {"kv_budget_mb": mb, "clients": clients, "follow_up_reuse_rate": rate, "kv_evictions": 5,
                "kv_rejected": 1, "follow_up_ttft_ratio": ratio, "follow_ups": 8}

    rows = [row(64, 1, 1.0), row(64, 4, 1.0), row(64, 8, 0.9), row(8, 1, 1.0), row(8, 4, 0.2, 2.5), row(8, 8, 0.0, 3)]
    text = collapse_sentence(rows)
    assert text.startswith("With a 64 MiB KV budget reuse held up to 8 clients (follow-ups reused their history "
                           "90%–100% of the time)")
    assert "with a 8 MiB KV budget reuse collapses at 4 clients: follow-up turns reused their history 20% of the " \
           "time, against 100% at 1, the cache evicted 5 entries and refused 1" in text and "2.50× the first" in text
    assert "| 8 | 4 | 8 | 20% |" in reuse_table(rows)
    assert "cannot be judged" in collapse_sentence([{"clients": 1, "follow_up_reuse_rate": None}])


# --- a real multi-turn load, through the API, on the tiny model --------------------------------------
@pytest.fixture(scope="module")
def conversations(tiny):
    engine = Engine(tiny, max_batch=4)
    pool = build_pool(4, 6, {}, turns=3, reuse_only=True)
    compute_references(engine, pool)
    with BackgroundServer(create_api(engine)) as url:
        yield engine, url, pool
    engine.close()


def entry_bytes(engine, pool) -> int:
    """The prefix-cache bytes one whole conversation holds at its last turn (played alone, in a session)."""
    from engine.core.config import GenerationConfig

    with kv_budget(engine, 256.0):
        engine.prefix_cache.drop()
        for turn in pool[0].turns:
            engine.complete(turn.body["messages"], GenerationConfig(temperature=0.0, max_new_tokens=6),
                            session="probe")
        held = max(e.nbytes for e in engine.prefix_cache.entries() if e.scope == "session:probe")
        engine.prefix_cache.drop()
    return held


def test_reuse_holds_while_the_conversations_fit_and_collapses_past_the_budget(conversations):
    engine, url, pool = conversations
    one = entry_bytes(engine, pool)
    budget_before = engine.prefix_cache.budget_bytes
    think = ThinkTime(0.3, "constant")
    rows = {}
    room_for_two = 2.5 * one / 2**20  # the chat template's shared preamble may take some of it
    with MemorySampler(engine.prefix_cache) as sampler:
        for mb, clients in ((64.0, 8), (room_for_two, 1), (room_for_two, 8)):
            result = run_load(engine, url, pool, (clients,), duration=60, max_requests=3 * clients * 2,
                              cancel_every=0, deadline=120, repeat=1, sampler=sampler, out=lambda line: None,
                              think=think, kv_budget_mb=mb)
            row = rows[(round(mb, 3), clients)] = result["rows"][0]
            assert row["exact"] == row["requests"] == 3 * clients * 2, row  # the judge: nothing lost or crossed
            assert result["kv_within_budget"] and result["stuck_workers"] == 0
            assert row["think_time_s_mean"] == pytest.approx(0.3)
    big, fits, over = rows.values()
    assert big["follow_up_reuse_rate"] == 1.0 and fits["follow_up_reuse_rate"] == 1.0
    assert over["follow_up_reuse_rate"] < 0.5 <= fits["follow_up_reuse_rate"]  # the cliff: 8 histories, room for 2
    assert over["kv_evictions"] > fits["kv_evictions"] >= 0 and big["kv_evictions"] == 0
    assert over["prefix_hit_rate"] < big["prefix_hit_rate"]
    assert over["follow_up_prefill_tokens_p50"] > big["follow_up_prefill_tokens_p50"]
    assert engine.prefix_cache.budget_bytes == budget_before  # the run's budget was put back
    sentence = collapse_sentence(list(rows.values()))
    assert "reuse collapses at 8 clients" in sentence and "64 MiB KV budget reuse held up to 8 clients" in sentence


def test_every_figure_of_a_reuse_row_is_in_the_glossary():
    from ui.shell.glossary import METRICS

    for name in ("think_time_s", "kv_budget_mb", "follow_up_reuse_rate", "prefix_hit_rate", "kv_evictions",
                 "kv_rejected", "kv_peak_mb", "follow_ups", "follow_up_ttft_ratio"):
        assert METRICS[name].end, name
