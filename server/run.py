"""Serve an ASGI app with uvicorn on a background thread: for tests, the bench, and notebooks.

`with BackgroundServer(app) as url:` binds a free loopback port and yields `http://127.0.0.1:PORT`.
"""

from __future__ import annotations

import threading
import time

import uvicorn


class BackgroundServer:
    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"):
        # lifespan "auto": a mounted Gradio page starts its queue there; a bare API has none
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level))
        self.thread = threading.Thread(target=self.server.run, name="api-server", daemon=True)
        self.url: str | None = None

    def start(self, timeout: float = 60.0) -> str:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the API server did not start")
            time.sleep(0.01)
        host, port = self.server.servers[0].sockets[0].getsockname()[:2]
        self.url = f"http://{host}:{port}"
        return self.url

    def stop(self, timeout: float = 10.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
