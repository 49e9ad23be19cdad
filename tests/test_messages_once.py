"""Chat messages are checked once, where they enter: the API's body model, else when a Request is made."""

import pytest

from engine.core import request as engine_request
from engine.core.errors import InvalidRequest
from engine.core.request import Messages, Request
from server import protocol
from server.protocol import parse_chat_request

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
def checks(monkeypatch):
    calls = []
    real = engine_request.validate_messages

    def counting(messages):
        calls.append(messages)
        return real(messages)

    monkeypatch.setattr(engine_request, "validate_messages", counting)
    monkeypatch.setattr(protocol, "validate_messages", counting)
    return calls


def test_the_api_checks_a_body_s_messages_and_its_request_takes_them_as_they_are(checks):
    chat = parse_chat_request({"messages": HI})
    assert isinstance(chat.messages, Messages) and len(checks) == 1
    Request(messages=chat.messages)
    assert len(checks) == 1


def test_messages_from_elsewhere_are_checked_when_the_request_is_made(checks):
    assert Request(messages=[{"role": "user", "content": "hi", "extra": 1}]).messages == HI
    assert len(checks) == 1
    Request(prompt_ids=[1, 2, 3])  # ready ids: no messages to check
    assert len(checks) == 1
    with pytest.raises(InvalidRequest, match="not valid Unicode") as err:
        Request(messages=[{"role": "user", "content": "\ud800"}])
    assert err.value.param == "messages"
    with pytest.raises(InvalidRequest, match="messages must be a non-empty list"):
        Request()
