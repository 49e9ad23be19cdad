"""Small helpers several test modules share (imported as `support`: pytest puts tests/ on sys.path)."""

import contextlib


def ask(text: str) -> list[dict]:
    """One user message, as chat messages."""
    return [{"role": "user", "content": text}]


class Recording:
    """An engine that remembers the handles it gave out, so tests can see the server side."""

    def __init__(self, engine):
        self.engine, self.handles = engine, []

    def submit(self, *args, **kwargs):
        handle = self.engine.submit(*args, **kwargs)
        self.handles.append(handle)
        return handle

    def __getattr__(self, name):
        return getattr(self.engine, name)


@contextlib.contextmanager
def served(engine):
    """The engine, recorded, behind our API on a free loopback port: yields (url, recording, model name)."""
    from server.api import create_api
    from server.run import BackgroundServer

    rec = Recording(engine)
    name = engine.info().name
    server = BackgroundServer(create_api({name: rec}))
    url = server.start()
    try:
        yield url, rec, name
    finally:
        server.stop()


def cancel_once_streaming(handle, after_tokens: int = 2, timeout: float = 120):
    """Read a request's events and cancel it once `after_tokens` tokens have streamed; returns the handle."""
    for event in handle.events(timeout=timeout):
        if event.kind == "chunk" and event.output_tokens >= after_tokens:
            handle.cancel()
    return handle


def public_preamble(engine, timeout: float = 120) -> int:
    """The length of the public preamble's entry (engine/serving/public_prefix.py) once the engine's idle
    worker has prefilled it: what any request with KV reuse on is served, whoever sent it."""
    import time

    from engine.serving.public_prefix import preamble_ids

    model = engine.loaded.model
    key = engine.prefix_cache.key_for(model)
    deadline = time.time() + timeout
    while not engine.prefix_cache.has_public(key) and time.time() < deadline:
        time.sleep(0.05)
    assert engine.prefix_cache.has_public(key), "the idle worker never prefilled the public preamble"
    return len(preamble_ids(engine.loaded.tokenizer))


@contextlib.contextmanager
def paced_app(*args, **kwargs):
    """The real page app over a paced test source (ui/chat/paced.py, no model) on a free loopback
    port: yields its URL; the source is closed after. Arguments go to PacedSource."""
    from server.run import BackgroundServer
    from ui.chat.paced import PacedSource
    from ui.webapp import create_app

    source = PacedSource(*args, **kwargs)
    try:
        with BackgroundServer(create_app(source)) as url:
            yield url
    finally:
        source.close()
