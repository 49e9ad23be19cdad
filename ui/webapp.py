"""One FastAPI app on one port: the page's /lab endpoints, any API routers, and the Gradio page at /."""

from __future__ import annotations

import socket
import threading
import time

import gradio as gr
import uvicorn
from fastapi import APIRouter, FastAPI

from .chat import ChatStore
from . import engine_info
from .page import build_page, css, head
from .presets import load_prompt_sets, teaching_presets
from .stream_api import lab_router


def create_app(engines, routers: tuple[APIRouter, ...] = (), app: FastAPI | None = None) -> FastAPI:
    """`engines`: one engine, or {backend name: engine}. `routers` are included before the page
    is mounted at "/", which would otherwise shadow them. `app`: an existing FastAPI app to build
    on (e.g. the OpenAI-compatible API's), so the page, /lab and the API share one port. Serve it
    with the lifespan on: Gradio starts its queue there."""
    store = ChatStore(engines)
    prompt_sets = load_prompt_sets()
    presets = teaching_presets(prompt_sets)
    app = app or FastAPI(title="Latency Lab", docs_url=None, redoc_url=None)
    app.state.store = store
    app.include_router(lab_router(store, presets))
    for router in routers:
        app.include_router(router)
    page = build_page(store, prompt_sets, presets)
    theme = gr.themes.Soft(primary_hue="indigo", neutral_hue="slate")
    variants = engine_info.variants(store.info)
    return gr.mount_gradio_app(app, page, path="/", css=css(), head=head(presets, variants), theme=theme,
                               footer_links=["api", "settings"], run_history=False)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class BackgroundServer:
    """uvicorn on a thread (tests, benches): `with BackgroundServer(app) as url: ...`."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int | None = None):
        self.host, self.port = host, port or free_port(host)
        self.server = uvicorn.Server(uvicorn.Config(app, host=self.host, port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.05)
        return self.url

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)
