"""One FastAPI app on one port: the page's /lab endpoints, any API routers, and the Gradio page at /."""

from __future__ import annotations

import gradio as gr
from fastapi import APIRouter, FastAPI

from .chat.routes import lab_router
from .chat.store import ChatStore
from .compare.routes import compare_router
from .insight.routes import insight_router, replay_part
from .load.api import load_router
from .load.run import LoadRunner
from .page import build_page, css, head
from .shell.header import header_router
from .shell.presets import load_prompt_sets, teaching_presets
from .shell.static import Scripts
from .trace.routes import trace_router


def create_app(engines, routers: tuple[APIRouter, ...] = (), app: FastAPI | None = None) -> FastAPI:
    """`engines`: one engine, or {backend name: engine}. `routers` are included before the page
    is mounted at "/", which would otherwise shadow them. `app`: an existing FastAPI app to build
    on (e.g. the OpenAI-compatible API's), so the page, /lab and the API share one port. Serve it
    with the lifespan on: Gradio starts its queue there."""
    app = app or FastAPI(title="Latency Lab", docs_url=None, redoc_url=None)
    store = ChatStore(engines, sessions=getattr(app.state, "sessions", None))  # the API's registry, when mounted on it
    prompt_sets = load_prompt_sets()
    presets = teaching_presets(prompt_sets)
    app.state.store = store
    app.include_router(lab_router(store, presets, after_turn=(replay_part(store),)))  # a reply's turn, and its replay
    scripts = Scripts()  # the page's scripts, ES modules (ui/entry.js first), read once
    app.include_router(scripts.router())
    app.include_router(header_router(store))  # the header's limits and report
    app.include_router(compare_router(store))  # the A/B pair's delta table
    app.include_router(trace_router(store))  # the Trace downloads (ui/trace/trace.js)
    app.include_router(insight_router(store))  # the what-if (ui/insight/)
    # the Load tab's clients go through the API's /v1 routes, when this app has them (app.py mounts them)
    has_api = any(getattr(r, "path", "") == "/v1/chat/completions" for r in app.routes)
    app.include_router(load_router(LoadRunner(store.engines, prompt_sets), has_api))
    for router in routers:
        app.include_router(router)
    page = build_page(store, prompt_sets, presets, load_ready=has_api)
    theme = gr.themes.Soft(primary_hue="indigo", neutral_hue="slate")
    return gr.mount_gradio_app(app, page, path="/", css=css(), head=head(presets, store.info, scripts), theme=theme,
                               footer_links=["api", "settings"], run_history=False)
