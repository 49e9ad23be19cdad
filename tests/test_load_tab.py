"""The Load tab without a browser: run-scoped batch limits in the engine (a load run's max batch,
other requests unaffected), the API's batch_scope field, the tab's settings, and its figures,
delta table and sentence (ui/load/run.py, ui/load/report.py). The page itself: tests/ui_browser/test_ui_load.py."""

import pytest
from support import ask

from engine.core.config import GenerationConfig
from engine.core.errors import InvalidRequest
from engine.serving.service import Engine
from server.load.pool import Result
from server.protocol import parse_chat_request
from ui.load.report import (
    LoadPoint,
    RunFigures,
    delta_html,
    pair_sentence,
    throughput_series,
)
from ui.load.run import (
    LOAD_POOL,
    PAGE_MAX_BATCH,
    RunState,
    build_conversations,
    parse_spec,
)

LONG = GenerationConfig(temperature=0.0, max_new_tokens=64)


@pytest.fixture(scope="module")
def batching_tiny(tiny):
    engine = Engine(tiny, max_batch=4)
    yield engine
    engine.close()


def _streamed(handle, tokens: int):
    for event in handle.events(timeout=300):
        if event.kind == "chunk" and event.output_tokens >= tokens or event.kind in ("done", "error"):
            return handle
    return handle


def test_a_scope_of_one_runs_its_requests_one_at_a_time_while_others_still_batch(batching_tiny):
    scope = batching_tiny.open_batch_scope(1)
    try:
        first = _streamed(batching_tiny.submit(ask("Write a long story."), LONG, batch_scope=scope), 1)
        second = batching_tiny.submit(ask("Write a long poem."), LONG, batch_scope=scope)
        other = batching_tiny.submit(ask("Write a long song."), LONG)  # another session's chat: no scope
        a, b, c = first.result(timeout=300), second.result(timeout=300), other.result(timeout=300)
    finally:
        batching_tiny.close_batch_scope(scope)
    assert b.timeline.started_ns >= a.timeline.done_ns  # the run's limit: one of its requests at a time
    assert c.timeline.started_ns < a.timeline.done_ns  # the engine's limit for everyone else
    assert max(c.timeline.batch_size) >= 2  # ...and it decoded in the same forwards as the run's request


def test_a_larger_scope_batches_its_own_requests(batching_tiny):
    scope = batching_tiny.open_batch_scope(3)
    try:
        first = _streamed(batching_tiny.submit(ask("Write a long story."), LONG, batch_scope=scope), 1)
        second = batching_tiny.submit(ask("Write a long poem."), LONG, batch_scope=scope)
        a, b = first.result(timeout=300), second.result(timeout=300)
    finally:
        batching_tiny.close_batch_scope(scope)
    assert b.timeline.started_ns < a.timeline.done_ns and max(b.timeline.batch_size) >= 2


def test_scopes_are_checked(batching_tiny, tiny):
    with pytest.raises(InvalidRequest, match="1 to 4"):
        batching_tiny.open_batch_scope(5)
    with pytest.raises(InvalidRequest, match="unknown batch_scope"):
        batching_tiny.submit(ask("Hi."), LONG, batch_scope="made-up")
    one_at_a_time = Engine(tiny)  # --max-batch 1: only a scope of 1
    try:
        assert one_at_a_time.open_batch_scope(1)
        with pytest.raises(InvalidRequest, match="--max-batch 1"):
            one_at_a_time.open_batch_scope(2)
    finally:
        one_at_a_time.close()


def test_the_api_reads_batch_scope_and_refuses_a_bad_one():
    body = {"messages": ask("Hi."), "batch_scope": "abc"}
    assert parse_chat_request(body).batch_scope == "abc"
    assert parse_chat_request({"messages": ask("Hi.")}).batch_scope is None
    with pytest.raises(InvalidRequest, match="batch_scope"):
        parse_chat_request({**body, "batch_scope": 7})


class _Local:
    """An engine as parse_spec sees it: batch scopes, and a max batch in its info."""

    def __init__(self, max_batch):
        self.max_batch = max_batch

    def open_batch_scope(self, limit):
        return "s"

    def info(self):
        from engine.core.info import EngineInfo

        return EngineInfo(name="m", source="bundled", batching={"max_batch": self.max_batch} if self.max_batch > 1 else None)


class _Remote:
    pass


SETS = {"open_questions": {"title": "Open", "items": [{"turns": ["Why?"]}, {"turns": ["How?"]}]},
        "long_history": {"title": "Long", "items": [{"history": [{"role": "user", "content": "x"}], "turns": ["a"]}]}}


def test_settings_default_check_and_follow_the_backend():
    engines = {"local": _Local(PAGE_MAX_BATCH), "remote": _Remote()}
    spec = parse_spec({}, SETS, engines)
    assert (spec.clients, spec.max_batches, spec.prompt_set, spec.backend) == (4, (1, PAGE_MAX_BATCH), LOAD_POOL, "local")
    assert parse_spec({"clients": 16.0, "requests_per_client": 3}, SETS, engines).requests == 48  # a slider's float
    assert parse_spec({"backend": "remote"}, SETS, engines).max_batches == (None, None)  # its server batches
    for bad, param in (({"clients": 0}, "clients"), ({"max_batch_2": 9}, "max_batch_2"), ({"prompt_set": "x"}, "prompt_set"),
                       ({"prompt_set": "long_history"}, "prompt_set"), ({"backend": "x"}, "backend"),
                       ({"what": 1}, "what"), ({"max_new_tokens": "ten"}, "max_new_tokens")):
        with pytest.raises(InvalidRequest) as err:
            parse_spec(bad, SETS, engines)
        assert err.value.param == param
    with pytest.raises(InvalidRequest, match="--max-batch 1"):
        parse_spec({}, SETS, {"local": _Local(1)})


def test_conversations_come_from_the_bench_pool_or_a_page_set():
    spec = parse_spec({"clients": 2, "requests_per_client": 2, "max_new_tokens": 5}, SETS, {"local": _Local(8)})
    pool = build_conversations(spec, SETS)
    assert len(pool) == 2 and all(len(c.turns) == 2 for c in pool)  # two-turn conversations of the bench
    assert all(t.body["max_tokens"] == 5 and "speculative" not in t.body for c in pool for t in c.turns)
    page = build_conversations(parse_spec({"prompt_set": "open_questions"}, SETS, {"local": _Local(8)}), SETS)
    assert [c.turns[0].body["messages"][0]["content"] for c in page] == ["Why?", "How?"]


def _result(outcome, tokens=8, ttft=100.0, tpot=20.0, queue=5.0, batch=(1, 2)):
    return Result("c0t1", 2, outcome=outcome, timings={"output_tokens": tokens, "ttft_ms": ttft, "tpot_ms": tpot,
                                                      "queue_ms": queue, "e2e_ms": ttft + tpot * 7,
                                                      "batch_size": list(batch)})


def test_throughput_so_far_counts_exact_replies_and_ends_on_the_run_figure():
    points = [LoadPoint.of(_result("exact"), 0.2), LoadPoint.of(_result("exact"), 0.7),
              LoadPoint.of(_result("crossed"), 0.8)]
    series = throughput_series(points, 1.0, steps=4)
    assert [(s.t_s, s.req_per_s, s.output_tok_per_s) for s in series] == [
        (0.25, 4.0, 32.0), (0.5, 2.0, 16.0), (0.75, 2.667, 21.33), (1.0, 2.0, 16.0)]
    assert throughput_series([], 0.0) == []


def _run(label, max_batch, results, wall):
    run = RunState(label, max_batch, status="done", wall_s=wall)
    run.figures = RunFigures.of(2, results, wall)
    return run


def test_figures_delta_table_and_sentence_state_the_measured_trade_off():
    one = _run("max batch 1", 1, [_result("exact", ttft=900, tpot=20, queue=800) for _ in range(4)], 4.0)
    two = _run("max batch 8", 8, [_result("exact", ttft=200, tpot=35, queue=10) for _ in range(4)], 2.0)
    assert (one.figures.output_tok_per_s, two.figures.output_tok_per_s) == (8.0, 16.0)
    assert one.figures.lost == one.figures.crossed == one.figures.mismatched == 0
    assert one.figures.batch_size_mean == 1.5
    sentence = pair_sentence(2, one, two)
    assert sentence.startswith("Max batch 8 gave 2.00× the output tok/s of max batch 1 at 2 clients")
    assert "p50 TTFT went from 900 to 200 ms" in sentence and "decode slower" in sentence
    table = delta_html(one, two)
    assert "run 1: max batch 1" in table and "run 2: max batch 8" in table and "2.00×" in table


def test_tokens_beside_a_prefill_are_split_out_and_explained():
    def beside(prompts, itl):
        r = _result("exact", tokens=len(prompts))
        r.timings.update(batch_prompt_tokens=list(prompts), itl_ms=list(itl))
        return r

    # token 0 (its own prefill) is not a decode token; of the 6 decode tokens 2 shared a forward with a prompt
    two = _run("max batch 8", 8, [beside([13, 0, 40, 0, 0], [30, 90, 31, 29]), beside([9, 0, 0], [33, 28])], 2.0)
    f = two.figures
    assert (f.with_prompt_share, f.itl_ms_decode_only_p50) == (round(1 / 6, 3), 30.0)
    assert f.itl_ms_with_prompt_p50 == 90.0
    one = _run("max batch 1", 1, [beside([13, 0, 0], [30, 31])], 4.0)
    assert one.figures.with_prompt_share == 0.0 and one.figures.itl_ms_with_prompt_p50 is None
    sentence = pair_sentence(2, one, two)
    assert "In max batch 8, 17% of the decode tokens shared their forward with a newcomer's prompt" in sentence
    assert "p50 ITL 90.0 ms, against 30.0 ms in decode-only forwards" in sentence
    assert "shared their forward" not in pair_sentence(2, two, one)  # run 2 had none: no clause
    table = delta_html(one, two)
    assert '<tr data-metric="itl_ms_with_prompt_p50">' in table and "<td>—</td><td>90.0</td>" in table
    assert "<td>0%</td><td>17%</td>" in table  # the share as a percentage


def test_unknown_figures_are_a_dash_never_zero():
    """One level_row serves the bench and the tab: a server that sent no batch sizes has an unknown
    mean batch (None, printed as a dash), never a made-up 1.0."""
    from server.load.figures import compare_rows, compare_table, level_row

    unknown = [Result("c0t1", 2, outcome="exact", timings={"output_tokens": 4})]
    row = level_row(2, unknown, 1.0)
    assert row["batch_size_mean"] is None and row["ttft_ms_p50"] is None
    compared = compare_rows([2], [row], [level_row(2, [_result("exact")], 1.0)])
    assert compared[0]["batch_size_mean_a"] is None and compared[0]["batch_size_mean_ratio"] is None
    assert "- → 1.5 (-×)" in compare_table(compared, 1, 8)
    remote = _run("run 1", None, unknown, 1.0)
    assert remote.figures.batch_size_mean is None and remote.figures.ttft_ms_p50 is None
    assert remote.figures.with_prompt_share is None and remote.figures.itl_ms_decode_only_p50 is None
    table = delta_html(remote, remote)
    assert '<tr data-metric="ttft_ms_p50"><th title="' in table and "<td>—</td><td>—</td><td>—</td>" in table
    assert "noise" in pair_sentence(2, remote, remote) and "from — to — ms" in pair_sentence(2, remote, remote)


def test_where_exactness_is_not_promised_an_unlike_reply_differs_and_still_counts_as_served():
    """fp32 weights as loaded promise exact replies; bf16, quantized weights and remote servers do not
    (EngineInfo.exact_replies). There a reply unlike its reference but nobody else's *differs*: counted
    among whole replies (throughput, latency), not as a failure; a crossed one is a failure everywhere."""
    from engine.core.info import EngineInfo, VariantInfo
    from server.load.figures import BAD, level_row
    from server.load.pool import Turn, judge

    fp32 = EngineInfo("m", "bundled", dtype="fp32", device="cpu",
                      variants=(VariantInfo("fp32", "as loaded", default=True), VariantInfo("int8wo", "8-bit")))
    assert fp32.exact_replies(None) and fp32.exact_replies("fp32") and not fp32.exact_replies("int8wo")
    assert not EngineInfo("m", "bundled", dtype="bf16", device="cpu", variants=fp32.variants).exact_replies(None)
    assert not EngineInfo("m", "remote", dtype="fp32", device="cpu", variants=fp32.variants).exact_replies(None)

    refs = {"c0t1": "Paris is the capital.", "c1t1": "Rome is the capital."}
    unlike = Result("c0t1", 2, outcome="done", text="Paris, the capital.", timings={"prompt_tokens": 9})
    crossed = Result("c0t1", 2, outcome="done", text="Rome is the capital.", timings={"prompt_tokens": 9})
    promised, not_promised = (Turn("c0t1", {}, refs["c0t1"], 9, exact=e) for e in (True, False))
    assert judge(unlike, promised, refs) == "mismatched" and judge(unlike, not_promised, refs) == "differs"
    assert judge(crossed, not_promised, refs) == "crossed" and "crossed" in BAD and "differs" not in BAD

    served = [_result("exact"), _result("differs")]
    row = level_row(2, served, 1.0)
    assert row["differs"] == 1 and row["req_per_s"] == 2.0 and row["output_tok_per_s"] == 16.0
    figures = RunFigures.of(2, served, 1.0)
    assert figures.differs == 1 and figures.exact == 1 and figures.mismatched == 0
    assert "differs (exactness not promised)" in delta_html(_run("a", 1, served, 1.0), _run("b", 8, served, 1.0))


def test_the_page_imports_the_load_package_through_its_one_door_never_the_bench():
    """ui/ runs the load generator (server/load/) through one module of it (server/load/runs.py);
    server/bench only wraps it for the command line."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    found = []
    for path in (root / "ui").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [(path.relative_to(root).as_posix(), n) for n in names if n.startswith("server.")]
    assert ("ui/load/run.py", "server.load.runs") in found  # the walk sees the page's imports
    assert [f for f in found if f[1].startswith("server.bench")] == []
    assert [f for f in found if f[1].startswith("server.load") and f[1] != "server.load.runs"] == []


def test_each_request_of_run_2_against_the_same_request_in_run_1_gets_the_ab_statistics():
    """The Load tab's pair through the one statistics module (ui/compare/stats.py): each whole reply of run 2
    against the same scripted request in run 1, intervals, Holm and the floors; the delta table marks a
    latency figure only where those statistics decide it."""
    from ui.load.report import request_pairs

    def run(label, max_batch, ttft, tpot, queue):
        results = [Result(f"c{i}t{t}", 2, outcome="exact", timings={
            "output_tokens": 8, "ttft_ms": ttft * (1 + 0.07 * i + 0.01 * t), "tpot_ms": tpot * (1 + 0.01 * ((i + t) % 3)),
            "queue_ms": queue * (1 + 0.05 * i), "e2e_ms": ttft + 7 * tpot}) for i in range(6) for t in (1, 2)]
        r = _run(label, max_batch, results, 2.0)
        r.points = [LoadPoint.of(x, 0.1 * k) for k, x in enumerate(results)]
        return r

    one, two = run("max batch 1", 1, 900, 20, 800), run("max batch 8", 8, 200, 35, 0.4)
    table = {p.metric: p for p in request_pairs(one, two)}
    assert table["ttft_ms"].n == 12 and table["ttft_ms"].winner == "B" and table["tpot_ms"].winner == "A"
    assert table["ttft_ms"].orders == "AB only"  # run 1 always ran first: said, not hidden
    page = delta_html(one, two)
    assert "Per request</b> (run 1 as A, run 2 as B). Run 2 cuts TTFT (server) to 0.22x (" in page
    assert "12 items, run 1 always first" in page and "an order effect cannot be told from a difference" in page
    assert '<tr data-metric="ttft_ms_p50"><th title="' in page
    ttft_row = page.split('<tr data-metric="ttft_ms_p50">')[1].split("</tr>")[0]
    assert ttft_row.count("lab-win") == 1 and ttft_row.index("lab-win") > ttft_row.index("<td>")  # run 2's cell
    same = run("max batch 1", 1, 900, 20, 800)
    page = delta_html(one, same)
    latency = "".join(page.split(f'<tr data-metric="{m}">')[1].split("</tr>")[0]
                      for m in ("ttft_ms_p50", "tpot_ms_p50", "queue_ms_p50", "e2e_ms_p50"))
    assert "lab-win" not in latency and "No difference detected in TTFT (server)" in page


def test_turns_think_time_and_kv_budgets_make_a_reuse_study():
    from server.load.reuse import ThinkTime
    from ui.load.run import LoadPair, RunState

    engines = {"local": _Local(8)}
    plain = parse_spec({}, SETS, engines)
    assert (plain.turns, plain.think, plain.kv_budgets, plain.reuse_study) == (2, None, (None, None), False)
    spec = parse_spec({"clients": 2, "requests_per_client": 3, "turns": 3, "think_time_s": 0.5, "think_dist": "lognormal",
                       "kv_budget_mb_1": 0.05}, SETS, engines)
    assert spec.turns == 3 and spec.think == ThinkTime(0.5, "lognormal") and spec.kv_budgets == (0.05, None)
    pool = build_conversations(spec, SETS)
    assert len(pool) == 2 and all(len(c.turns) == 3 and c.with_session for c in pool)
    assert all(t.body.get("kv_reuse", True) for c in pool for t in c.turns)  # the study's pool: reuse everywhere
    for bad, param in (({"turns": 0}, "turns"), ({"think_time_s": -1}, "think_time_s"),
                       ({"think_dist": "gamma"}, "think_dist"), ({"kv_budget_mb_2": -2}, "kv_budget_mb_2")):
        with pytest.raises(InvalidRequest) as err:
            parse_spec(bad, SETS, engines)
        assert err.value.param == param
    # both runs over: the reuse table and the one sentence naming where reuse collapses
    pair = LoadPair("p", spec, [RunState("max batch 1 · KV 0.05 MiB", 1, 0.05), RunState("max batch 8", 8)],
                    status="done")
    common = {"clients": 2, "follow_ups": 4, "kv_rejected": 0, "first_turn_ttft_ms_p50": 80.0}
    pair.runs[0].reuse = {**common, "kv_budget_mb": 0.05, "follow_up_reuse_rate": 0.0, "prefix_hit_rate": 0.1,
                          "kv_evictions": 9, "follow_up_ttft_ms_p50": 120.0, "follow_up_ttft_ratio": 1.5}
    pair.runs[1].reuse = {**common, "kv_budget_mb": 64.0, "follow_up_reuse_rate": 1.0, "prefix_hit_rate": 0.8,
                          "kv_evictions": 0, "follow_up_ttft_ms_p50": 40.0, "follow_up_ttft_ratio": 0.5}
    parts = pair.reuse_parts(done=True)
    assert parts["reuse_html"].count("<tr>") == 3 and "history reused" in parts["reuse_html"]
    assert "0.05 MiB KV budget reuse collapses at 2 clients" in parts["reuse_sentence"]
    assert "64 MiB KV budget reuse held" in parts["reuse_sentence"]
    assert pair.reuse_parts(done=False) == {"reuse_html": None, "reuse_sentence": None}


def test_the_load_pool_references_a_paced_source_as_an_engine():
    """`app.py --paced-source` serves the Load tab too: its references come from `complete`, as the engine's."""
    from server.load.pool import build_pool, compute_references, offered_toggles
    from ui.chat.paced import PacedSource

    source = PacedSource(tokens_per_s=4000, prefill_ms=1)
    try:
        offers = offered_toggles(source, variants="none")
        assert offers == {"speculative": None, "quantization": None}  # the paced source drafts nothing
        pool = build_pool(1, 4, offers)
        compute_references(source, pool)
        assert all(t.ref_text and t.ref_prompt_tokens >= 1 for c in pool for t in c.turns)
    finally:
        source.close()
