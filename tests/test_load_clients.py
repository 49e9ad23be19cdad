"""The load's clients in a process of their own (server/load/clients.py): what the bench and
the page's Load tab both run. Real requests through the real API; the judge runs in the child."""

import threading

import pytest

from engine.serving.service import Engine
from server.api import create_api
from server.load.clients import drive_elsewhere
from server.load.drive import wait_idle
from server.load.pool import build_pool, compute_references
from server.run import BackgroundServer


@pytest.fixture(scope="module")
def served(tiny):
    engine = Engine(tiny, max_batch=4)
    pool = build_pool(2, 8, {"speculative": None, "quantization": None})
    compute_references(engine, pool)
    with BackgroundServer(create_api(engine)) as url:
        yield engine, url, pool
    engine.close()


def test_the_clients_judge_every_reply_and_report_each_as_it_comes(served):
    engine, url, pool = served
    seen = []
    results, wall = drive_elsewhere(url, pool, clients=2, duration=0.5, max_requests=4, cancel_every=0,
                                    deadline=120, on_result=seen.append)
    assert len(results) == 4 and seen == results  # one callback per judged request, in order
    assert all(r.outcome == "exact" for r in results), [(r.key, r.outcome, r.error) for r in results]
    assert all(r.timings["output_tokens"] >= 1 for r in results)  # the server's own timings came through
    assert wall > 0


def test_stop_ends_the_run_and_the_server_cancels_what_was_streaming(served):
    engine, url, pool = served
    stop = threading.Event()
    results, _ = drive_elsewhere(url, pool, clients=2, duration=600, max_requests=200, cancel_every=0,
                                 deadline=120, on_result=lambda r: stop.set(), stop=stop)
    assert 1 <= len(results) < 200
    assert wait_idle(engine)  # the killed clients' streams closed: nothing left queued or running


def test_clients_that_cannot_run_say_why():
    with pytest.raises(RuntimeError, match="client process failed"):
        drive_elsewhere("http://127.0.0.1:9", build_pool(1, 4, {}), clients=1, duration=0.1, max_requests=1,
                        cancel_every=0, deadline=5)
