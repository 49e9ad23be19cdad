"""The page's Gradio API through gradio_client: /chat (a turn through Gradio's queue, streamed as
NDJSON events) and /sweep (a prompt set through two configs)."""

import json

import pytest
from gradio_client import Client


@pytest.fixture(scope="module")
def client(page_server):
    return Client(page_server + "/", verbose=False)


def events(text: str) -> list[tuple[str, dict]]:
    return [(e["event"], e["data"]) for e in map(json.loads, text.splitlines())]


def test_the_api_lists_chat_and_sweep(client):
    assert {"/chat", "/sweep"} <= set(client.view_api(return_format="dict", print_info=False)["named_endpoints"])


def test_chat_streams_events_and_continues_a_conversation(client):
    payload = {"message": "Name a fruit.", "settings": {"temperature": 0, "max_new_tokens": 6}}
    job = client.submit(json.dumps(payload), api_name="/chat")
    updates = list(job)
    assert len(updates) >= 3  # streamed: start, status..., chunks..., done
    first = events(updates[-1])
    assert first[0][0] == "start" and first[-1][0] == "done"
    assert all(updates[i + 1].startswith(updates[i]) for i in range(len(updates) - 1))  # append-only
    record = first[-1][1]["record"]
    chunks = "".join(d["text"] for e, d in first if e == "chunk")
    assert record["reply"] == chunks and record["timeline"]["ttft_ms"] > 0 and record["turn"] == 1

    session = first[0][1]["session"]
    again = client.predict(json.dumps({"session": session, "message": "And another?",
                                       "settings": {"temperature": 0, "max_new_tokens": 6}}), api_name="/chat")
    assert events(again)[-1][1]["record"]["turn"] == 2


@pytest.mark.parametrize("payload, words", [
    ("not json", "Expecting value"),
    (json.dumps({"message": "hi", "settings": {"temperature": -2}}), "temperature"),
    (json.dumps({"message": ""}), "write a message"),
    (json.dumps(["a", "list"]), "JSON object"),
])
def test_chat_reports_bad_input_as_an_error_event(client, payload, words):
    out = events(client.predict(payload, api_name="/chat"))
    assert out[-1][0] == "error" and words in out[-1][1]["message"]


def test_sweep_runs_a_prompt_list_through_a_and_b(client):
    result = client.predict("custom", "Say yes.\nSay no.", {"temperature": 0, "max_new_tokens": 4, "kv_reuse": False},
                            {"temperature": 0, "max_new_tokens": 4, "kv_reuse": True}, 2, api_name="/sweep")
    # a warm-up pair (not counted), then the items, which config runs first alternating (ABBA)
    assert [(r["item"], r["pane"], r["order"]) for r in result["rows"]] == [
        (0, "A", "AB"), (0, "B", "AB"), (1, "A", "AB"), (1, "B", "AB"), (2, "B", "BA"), (2, "A", "BA")]
    assert [bool(r.get("warmup")) for r in result["rows"]] == [True, True, False, False, False, False]
    assert all(r["finish_reason"] in ("stop", "length") for r in result["rows"])
    assert result["design"]["order"] == "ABBA" and result["decision"]["correction"] == "holm"
    ttft = next(s for s in result["summary"] if s["metric"] == "ttft_ms")
    assert ttft["A n"] == 2 and ttft["B n"] == 2 and ttft["A p50"] > 0 and ttft["B p90"] >= ttft["B p50"]
