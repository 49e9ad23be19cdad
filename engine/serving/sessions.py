"""Server-side conversation state: each reply kept exactly as it was generated.

Why on the server: a client that sends its history back sends what it displays, and displays
differ from what the model produced (Gradio strips a reply's leading newline, for one). Re-tokenizing
that text gives different token ids, and the prefix cache, which matches token ids, then reuses
only the part before the first difference. A `Conversation` holds each reply's text exactly as the
engine returned it (and its token ids), so the next prompt — the chat template over these messages —
begins with the tokens whose KV the cache holds.

A conversation's `session` is its prefix-cache scope. It is the only thing that separates one
user's cached KV from another's, so session ids are unguessable: the server's one registry
(server/sessions.py) issues them for the API and the page alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.errors import InvalidRequest


@dataclass
class Message:
    role: str  # user | assistant
    content: str
    token_ids: list[int] | None = None  # assistant: ids exactly as generated (EOS included); None if typed
    finish_reason: str | None = None  # assistant: stop | length | cancelled
    timeline: object | None = None  # assistant: the reply's Timeline (its stats line on the page)

    def to_dict(self) -> dict:
        return {"role": self.role, "content": self.content}


@dataclass
class Conversation:
    session: str
    system: str | None = None
    messages: list[Message] = field(default_factory=list)

    def request_messages(self) -> list[dict]:
        """What to submit: the system prompt and the history, as chat messages."""
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + [m.to_dict() for m in self.messages]

    @property
    def awaiting_reply(self) -> bool:
        return bool(self.messages) and self.messages[-1].role == "user"

    def send(self, text: str) -> list[dict]:
        """Add a user message; return the messages to submit for its reply."""
        if not isinstance(text, str) or not text.strip():
            raise InvalidRequest("the message is empty: write something first", "messages")
        if self.awaiting_reply:
            raise InvalidRequest("the last message has no reply yet: regenerate it, edit it or clear", "messages")
        self.messages.append(Message("user", text))
        return self.request_messages()

    def add_reply(self, done) -> Message:
        """Record the engine's done event (also a cancelled one: the user saw that text)."""
        if not self.awaiting_reply:
            raise InvalidRequest("there is no user message waiting for this reply", "messages")
        reply = Message("assistant", done.text, list(done.token_ids), done.detail.get("finish_reason"), done.timeline)
        self.messages.append(reply)
        return reply

    def regenerate(self) -> list[dict]:
        """Drop the last reply (if any); return the messages to submit for a new one."""
        if self.messages and self.messages[-1].role == "assistant":
            self.messages.pop()
        if not self.awaiting_reply:
            raise InvalidRequest("there is nothing to regenerate: send a message first", "messages")
        return self.request_messages()

    def edit(self, index: int, text: str) -> list[dict] | None:
        """Replace message `index` and forget everything after it. Editing a user message returns
        the messages to submit for its new reply; editing a reply returns None (it is now typed text)."""
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(self.messages):
            raise InvalidRequest(f"message index must be 0 to {len(self.messages) - 1}, not {index!r}", "index")
        if not isinstance(text, str) or not text.strip():
            raise InvalidRequest("the edited message is empty", "messages")
        role = self.messages[index].role
        del self.messages[index:]
        self.messages.append(Message(role, text))
        return self.request_messages() if role == "user" else None

    def drop_unanswered(self) -> None:
        """Forget a trailing user message whose request failed."""
        if self.awaiting_reply:
            self.messages.pop()

    def clear(self) -> None:
        self.messages.clear()

