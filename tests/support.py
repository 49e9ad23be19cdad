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
