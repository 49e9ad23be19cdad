"""Reliability under load, faults and a full queue, and the safe defaults (bundled model, fp32).

The load test is the load bench's code (server/load/) in a short version: 8 streaming
clients through the API for a few seconds, twice, with the same checks as `python -m server.bench
load` — every completed reply equals the same request run alone, nothing lost, crossed or stuck,
no 5xx, the KV cache within its budget, memory not growing run over run."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest
from support import ask

from engine.core.config import GenerationConfig
from engine.serving.decoding import Decoding
from engine.serving.prefix_cache import PrefixCache
from engine.serving.service import Engine
from engine.serving.worker import Worker
from server.api import create_api
from server.load import drive as load_drive
from server.load import figures as load_figures
from server.load import pool as load_pool
from server.run import BackgroundServer

GREEDY = GenerationConfig(temperature=0.0, max_new_tokens=6)


# --- load ----------------------------------------------------------------------------------------
KV_BUDGET_MB = 12  # a few fp32 entries (~3 MB each): the budget binds and evicts under this load


@pytest.fixture(scope="module")
def loaded_api(bundled):
    engine = Engine(bundled, prefix_cache=PrefixCache(KV_BUDGET_MB))
    with BackgroundServer(create_api(engine)) as url:
        yield engine, url
    engine.close()


def test_under_load_every_reply_is_exact_and_nothing_is_lost_crossed_or_stuck(loaded_api):
    engine, url = loaded_api
    with load_drive.MemorySampler(engine.prefix_cache, every=0.1) as sampler:
        pool = load_pool.build_pool(6, 8, load_pool.offered_toggles(engine))
        load_pool.compute_references(engine, pool)
        result = load_drive.run_load(engine, url, pool, (8,), duration=10, max_requests=40, cancel_every=4,
                                     deadline=120, repeat=2, sampler=sampler, out=lambda *a: None)
    t = result["totals"]
    bad = (*load_figures.BAD, "4xx", "429")
    assert {k: t[k] for k in bad} == {k: 0 for k in bad}, result["rows"]
    assert t["exact"] >= 8 and t["cancelled"] >= 2  # the checks above had replies to judge
    assert result["stuck_workers"] == 0  # after each level nothing stayed queued or running
    assert result["server_5xx"] == 0  # not even to a client that had already gone
    row = result["rows"][0]
    assert row["queue_ms_p90"] is not None and row["ttft_ms_p50"] is not None and row["e2e_ms_p99"] is not None
    cache = result["prefix_cache"]
    assert result["kv_within_budget"] and result["kv_bytes_max"] <= KV_BUDGET_MB * 2**20
    assert cache["hits"] > 0 and cache["evictions"] > 0  # reuse happened, and the budget had to evict
    # A leak of each request's KV (~3 MB x ~20 requests a run) would show here; the cache itself is bounded.
    assert result["memory_ok"], result["runs"]
    assert result["rss_growth_besides_kv_cache_mb"] < load_drive.MEMORY_GROWTH_LIMIT_MB, result["runs"]


# --- faults --------------------------------------------------------------------------------------
FAULT_SEED = 4242  # a test-only hook: only this test's worker knows it; no request reaches it in the app


class Faulty(Decoding):
    """Requests with the fault seed raise: at prefill (max_new_tokens 7), else at the first decode step."""

    def prefill(self):
        if self.config.seed == FAULT_SEED and self.config.max_new_tokens == 7:
            raise RuntimeError("forced failure at prefill")
        return super().prefill()

    def step(self):
        if self.config.seed == FAULT_SEED:
            raise RuntimeError("forced failure mid-stream")
        return super().step()


@pytest.fixture(scope="module")
def faulty(bundled):
    engine = Engine(bundled)
    engine.worker.close()
    engine.worker = Worker(bundled, decoding_factory=Faulty, prefix_cache=engine.prefix_cache)
    with BackgroundServer(create_api(engine)) as url:
        yield engine, url
    engine.close()


def test_requests_that_fail_inside_the_engine_fail_alone_under_load(faulty):
    engine, url = faulty
    prompts = [f"Name an animal that starts with the letter {c}." for c in "ABCDEF"]
    references = {p: engine.complete(ask(p), GREEDY).text for p in prompts}

    async def one(http, i):
        body = {"messages": ask(prompts[i % len(prompts)]), "max_tokens": 6, "temperature": 0, "stream": i % 3 != 2}
        if i % 2:  # every other request hits a fault: at prefill (max_tokens 7) or mid-stream
            body.update(seed=FAULT_SEED, max_tokens=7 if i % 4 == 1 else 6)
        resp = await http.post(url + "/v1/chat/completions", json=body)
        return i, body, resp

    async def run():
        async with httpx.AsyncClient(timeout=120) as http:
            return await asyncio.gather(*(one(http, i) for i in range(12)))

    failed_before = engine.worker.failed
    for i, body, resp in asyncio.run(run()):
        faulted = body.get("seed") == FAULT_SEED
        if not body["stream"]:
            if faulted:
                assert resp.status_code == 500 and resp.json()["error"]["type"] == "server_error"
                assert "forced failure" in resp.json()["error"]["message"]
            else:
                assert resp.json()["choices"][0]["message"]["content"] == references[body["messages"][0]["content"]]
            continue
        assert resp.status_code == 200  # accepted before the fault: the error comes inside the stream
        chunks = [json.loads(line[6:]) for line in resp.text.splitlines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
        errors = [c["error"] for c in chunks if "error" in c]
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
        if faulted:
            assert len(errors) == 1 and errors[0]["type"] == "server_error" and "forced failure" in errors[0]["message"]
            assert references[body["messages"][0]["content"]].startswith(text)  # what it sent was right
        else:
            assert not errors and text == references[body["messages"][0]["content"]]
    assert engine.worker.failed - failed_before == 6
    assert engine.worker._thread.is_alive()
    assert engine.complete(ask(prompts[0]), GREEDY).text == references[prompts[0]]  # still serving, still exact


# --- queueing made visible -----------------------------------------------------------------------
GATE_SEED = 777


class Gated(Decoding):
    """A request with the gate seed holds the worker at prefill until the test opens the gate."""

    gate = threading.Event()

    def prefill(self):
        if self.config.seed == GATE_SEED:
            assert self.gate.wait(120), "the test never opened the gate"
        return super().prefill()


def gated_engine(bundled, max_queue=None) -> Engine:
    engine = Engine(bundled, max_queue=max_queue)
    engine.worker.close()
    engine.worker = Worker(bundled, max_queue=max_queue, decoding_factory=Gated, prefix_cache=engine.prefix_cache)
    return engine


def hold_worker(engine):
    """Submit the gated request and wait until the worker has started it."""
    Gated.gate.clear()
    blocker = engine.submit(ask("Say yes."), GREEDY.replace(seed=GATE_SEED, max_new_tokens=2))
    deadline = time.monotonic() + 60
    while engine.worker.position(blocker) is not None or not engine.worker.busy:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return blocker


def test_queue_positions_count_down_and_the_api_reports_position_and_queue_time(bundled):
    engine = gated_engine(bundled)
    try:
        with BackgroundServer(create_api(engine)) as url:
            blocker = hold_worker(engine)
            waiting = [engine.submit(ask(f"Say {w}."), GREEDY) for w in ("one", "two", "three")]
            answers = {}
            threading.Thread(target=lambda: answers.update(resp=httpx.post(
                url + "/v1/chat/completions", json={"messages": ask("Say four."), "max_tokens": 3, "temperature": 0,
                                                    "stream": True}, timeout=120))).start()
            deadline = time.monotonic() + 60
            while engine.worker.queue_depth() < 4:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            queue = httpx.get(url + "/v1/queue").json()["data"][0]
            assert (queue["waiting"], queue["running"], queue["max_queue"]) == (4, 1, None)
            Gated.gate.set()
            blocker.result(timeout=120)
            positions = [[e.detail["position"] for e in h.events(timeout=120) if e.kind == "status"
                          and e.stage == "queued"] for h in waiting]
            deadline = time.monotonic() + 120
            while "resp" not in answers:
                assert time.monotonic() < deadline
                time.sleep(0.02)
    finally:
        Gated.gate.set()
        engine.close()
    # Each waiting request was told its place, then each step up the line until it ran.
    assert positions == [[1], [2, 1], [3, 2, 1]]
    resp = answers["resp"]
    chunks = [json.loads(line[6:]) for line in resp.text.splitlines() if line.startswith("data: {")]
    timings = next(c["timings"] for c in chunks if "timings" in c)
    assert resp.headers["X-Queue-Position"] == "4" == str(timings["queue_position"])
    assert float(resp.headers["X-Queue-Ms"]) == pytest.approx(timings["queue_ms"], abs=1e-3)
    assert timings["queue_ms"] > 0


def test_a_full_queue_is_a_429_with_a_clear_message_in_the_api_and_the_page(bundled):
    from gradio_client import Client

    from ui.webapp import create_app

    engine = gated_engine(bundled, max_queue=1)
    try:
        api = create_api(engine)
        with BackgroundServer(create_app(api.state.backends, app=api)) as url:
            blocker = hold_worker(engine)
            queued = engine.submit(ask("Say two."), GREEDY)  # the one place in the queue is taken
            resp = httpx.post(url + "/v1/chat/completions", json={"messages": ask("hi"), "stream": True}, timeout=60)
            err = resp.json()["error"]
            assert resp.status_code == 429 and (err["type"], err["code"]) == ("rate_limit_error", "queue_full")
            assert "busy" in err["message"] and "--max-queue" in err["message"]

            # The page's own stream endpoint: the same words, as the page's errorText() reads them.
            session = httpx.post(url + "/lab/session").json()["session"]
            resp = httpx.post(url + "/lab/chat", json={"session": session, "message": "hi",
                                                       "settings": {"max_new_tokens": 2}}, timeout=60)
            assert resp.status_code == 429 and resp.json()["error"]["message"] == err["message"]
            # ...and through Gradio's queue (the page's other transport): an error event, not a crash.
            out = Client(url + "/", verbose=False).predict(
                json.dumps({"session": session, "message": "hi", "settings": {"max_new_tokens": 2}}), api_name="/chat")
            last = json.loads(out.splitlines()[-1])
            assert last["event"] == "error" and last["data"]["message"] == err["message"]
            Gated.gate.set()
            assert blocker.result(timeout=120).output_tokens > 0 and queued.result(timeout=120).output_tokens > 0
            resp = httpx.post(url + "/v1/chat/completions", json={"messages": ask("hi"), "max_tokens": 2}, timeout=120)
            assert resp.status_code == 200  # the line moved: served again
    finally:
        Gated.gate.set()
        engine.close()
