"""Exit codes of the commands (0 ok, 1 runtime failure, 2 usage), a bench that fails its own
verdict, and GET /health. No model is loaded."""

import argparse
import types

import httpx
import pytest

import app
import engine.bench
from engine.core.errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from engine.remote.client import RemoteEngine
from server.api import create_api
from server.run import BackgroundServer
from ui.chat.paced import PacedSource


def fake_scenario(result: dict):
    def build_parser(argv=None, *_):
        p = argparse.ArgumentParser()
        p.add_argument("scenario")
        p.add_argument("--json", action="store_true")
        return p, types.SimpleNamespace(run=lambda args, out: dict(result))

    return build_parser


@pytest.mark.parametrize("result, code", [({"ok": False, "ratio": None}, EXIT_FAILURE),
                                          ({"ok": True, "ratio": 1.0}, EXIT_OK),
                                          ({"ratio": 2.0}, EXIT_OK)])  # no verdict of its own
def test_a_bench_exits_non_zero_when_its_own_verdict_fails(monkeypatch, capsys, result, code):
    monkeypatch.setattr(engine.bench, "build_parser", fake_scenario(result))
    assert engine.bench.main(["load", "--json"]) == code
    if code == EXIT_FAILURE:
        assert '"ok": false' in capsys.readouterr().err


def test_usage_errors_exit_2_and_runtime_failures_exit_1(tmp_path):
    with pytest.raises(SystemExit) as exc:  # argparse's own
        app.main(["--max-queue", "-1"])
    assert exc.value.code == EXIT_USAGE
    assert app.main(["--backend", "openai"]) == EXIT_USAGE  # a flag it needs is missing
    assert app.main(["--model", str(tmp_path / "no-such-model")]) == EXIT_FAILURE  # the model does not load


def test_engine_cli_refuses_an_empty_prompt_as_usage():
    from engine.cli import main

    assert main(["   "]) == EXIT_USAGE


def test_health_says_which_engine_is_down():
    source = PacedSource(tokens_per_s=1000, prefill_ms=1)
    gone = RemoteEngine("http://127.0.0.1:9/v1", "far")
    gone.close()
    try:
        with BackgroundServer(create_api({"paced": source})) as url:
            assert httpx.get(url + "/health").json() == {"status": "ok", "models": ["paced"]}
        with BackgroundServer(create_api({"paced": source, "far": gone}, api_key="k")) as url:
            resp = httpx.get(url + "/health")  # no key needed
            assert resp.status_code == 503 and resp.json()["down"] == ["far"]
    finally:
        source.close()
