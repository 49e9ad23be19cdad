"""Latency Lab's page: the Gradio layout, the /lab stream endpoints, overlays, A/B and sweeps.

`ui.webapp.create_app(engine)` builds the one FastAPI app (page + endpoints); `app.py` serves it.
"""
