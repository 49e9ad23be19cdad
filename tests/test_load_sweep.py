"""The open-loop load against a served model: arrivals sent by the clients' child process, every
reply judged, a short sweep with its probe, the Load tab's open-loop endpoints (/lab/load/open),
and the bench's command line and JSON (vLLM's flag and field names). The arithmetic without a
model: tests/test_load_open.py."""

import json
import time

import pytest

from engine.serving.service import Engine
from server.api import create_api
from server.load.clients import drive_open_elsewhere
from server.load.open_loop import PROBE
from server.load.open_scenario import probe_turn, references
from server.load.pool import build_pool
from server.load.sweep import Sweep, SweepSettings
from server.run import BackgroundServer


@pytest.fixture(scope="module")
def served(tiny):
    engine = Engine(tiny, max_batch=4)
    pool = build_pool(2, 6, {"speculative": None, "quantization": None})
    probe = probe_turn("Say something about the sea.", 6)
    turns = references(engine, pool, probe, lambda line: None, "tiny")
    with BackgroundServer(create_api(engine)) as url:
        yield engine, url, turns, probe
    engine.close()


def test_open_loop_sends_at_the_arrival_times_and_judges_every_reply(served):
    _, url, turns, probe = served
    times = [0.0, 0.0, 0.0, 0.5, 0.5]  # three at once: the clients must not wait for each other
    results, wall = drive_open_elsewhere(url, turns, times, 120, probe=probe, probe_at=0.25)
    assert len(results) == 6 and sum(r.key == PROBE for r in results) == 1
    assert all(r.outcome == "exact" for r in results), [(r.key, r.outcome, r.error) for r in results]
    sent = sorted(r.sent_s for r in results if r.key != PROBE)
    assert sent[2] < 0.4 <= sent[3]  # the first three left together, before the later two were due
    assert all(r.client_ttft_ms and r.client_e2e_ms >= r.client_ttft_ms and r.output_tokens for r in results)
    assert wall >= 0.5


def test_a_short_sweep_rises_judges_and_marks_the_knee(served):
    from server.load.drive import wait_idle

    engine, url, turns, probe = served
    s = SweepSettings(rates=(2.0, 4.0, 8.0), num_prompts=4, objectives={"ttft": 60_000, "tpot": 60_000})
    lines = []
    out = Sweep(s, url, turns, probe=probe, max_batch=4, after_level=lambda _: wait_idle(engine),
                out=lines.append).run()
    assert [r["request_rate"] for r in out["levels"]] == [2.0, 4.0, 8.0] and len(lines) == 3
    for row, p in zip(out["levels"], out["probes"]):
        assert row["completed"] == row["exact"] == 4 and row["lost"] == row["crossed"] == row["mismatched"] == 0
        assert row["request_goodput"] == row["request_throughput"] > 0  # loose objectives: every request met them
        assert row["p90_ttft_ms"] is not None and row["mean_queue_ms"] is not None
        assert p["outcome"] == "exact" and p["decode_ms"] is not None and p["batch_size_mean"] >= 1
    assert out["knee_index"] is not None and out["ok"] and out["stuck_workers"] == 0


def test_the_load_tab_runs_a_sweep_per_max_batch_through_its_endpoints(tiny):
    from ui.webapp import create_app

    engine = Engine(tiny, max_batch=4)
    api = create_api(engine)
    with BackgroundServer(create_app(api.state.backends, app=api)) as url:

        import httpx

        settings = {"num_prompts": 3, "max_new_tokens": 4, "start_rate": 4, "factor": 2, "max_levels": 2,
                    "ttft_ms": 60000, "tpot_ms": 60000, "max_batches": [1, 4], "probe": "Hello there."}
        bad = httpx.post(url + "/lab/load/open/start", json={"settings": {**settings, "max_batches": [9]}})
        assert bad.status_code == 400 and "max batch must be 1 to 4" in bad.text, bad.text
        run = httpx.post(url + "/lab/load/open/start", json={"settings": settings}).json()
        busy = httpx.post(url + "/lab/load/start", json={"settings": {"max_batch_2": 2}})
        assert busy.status_code == 409  # one load at a time: the closed loop waits for the sweep
        deadline = time.monotonic() + 300
        while True:
            snap = httpx.get(f"{url}/lab/load/open/{run['id']}").json()
            if snap["status"] not in ("references", "running") or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    engine.close()
    assert snap["status"] == "done", snap["message"]
    assert [s["max_batch"] for s in snap["sweeps"]] == [1, 4]
    for s in snap["sweeps"]:
        assert [r["request_rate"] for r in s["levels"]] == [4.0, 8.0]
        assert s["totals"]["exact"] == 6 and s["ok"] and len(s["pareto"]) == 2
        assert all(p["outcome"] == "exact" for p in s["probes"])
    assert snap["sentence"].startswith("Max batch 4 reached")
    json.dumps(snap)  # JSON-ready, no inf or NaN


def test_the_bench_takes_vllm_flags_and_writes_vllm_field_names(tiny_model_dir, capsys):
    from server.bench import main

    rc = main(["load", "--model", str(tiny_model_dir), "--request-rate", "4", "--num-prompts", "3",
               "--max-new-tokens", "4", "--conversations", "2", "--max-batch", "2", "--burstiness", "0.5",
               "--goodput", "ttft:60000", "tpot:60000", "--percentile-metrics", "ttft,tpot,itl,e2el",
               "--metric-percentiles", "50,99", "--json"])
    assert rc == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    level = result["sweeps"]["2"]["levels"][0]
    assert result["burstiness"] == 0.5 and level["request_rate"] == 4.0 and level["completed"] == 3
    for name in ("request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
                 "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "p50_tpot_ms", "p99_itl_ms", "mean_e2el_ms"):
        assert level[name] is not None, name
    assert result["sweeps"]["2"]["probes"][0]["outcome"] == "exact" and result["ok"]


def test_the_same_sweep_runs_against_a_remote_server_from_the_client_side(served, capsys):
    """--base-url: another OpenAI-compatible server (here ours, on loopback, as a stranger would be reached):
    references through it one at a time, then open-loop levels; its batching is its own (max batch unknown)."""
    from server.bench import main

    engine, url, _, _ = served
    rc = main(["load", "--request-rate", "2,4", "--num-prompts", "3", "--max-new-tokens", "4", "--conversations", "2",
               "--base-url", url + "/v1", "--remote-model", engine.info().name, "--goodput", "e2el:60000", "--json"])
    assert rc == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    sweep = result["sweeps"]["remote"]
    assert sweep["max_batch"] is None and sweep["base_url"] == url + "/v1"
    assert [r["request_rate"] for r in sweep["levels"]] == [2.0, 4.0]
    for row in sweep["levels"]:
        assert row["completed"] == 3 and row["lost"] == row["crossed"] == row["mismatched"] == 0
        assert row["request_goodput"] == row["request_throughput"] and row["mean_e2el_ms"] is not None
    assert all(p["outcome"] in ("exact", "differs") for p in sweep["probes"]) and result["ok"]
