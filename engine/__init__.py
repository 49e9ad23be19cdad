"""Latency Lab's inference engine: load a model, serve requests, time every stage.

Knows nothing of Gradio or of our HTTP server (engine/remote/ is an HTTP *client* of other servers). Heavy modules load lazily, so importing a small piece
(`engine.core.timeline`, `engine.serving.detokenize`) stays cheap.
"""

__all__ = ["Engine", "GenerationConfig", "LoadConfig", "Timeline"]


def __getattr__(name):
    if name == "Engine":
        from engine.serving.service import Engine

        return Engine
    if name in ("GenerationConfig", "LoadConfig"):
        from engine.core import config

        return getattr(config, name)
    if name == "Timeline":
        from engine.core.timeline import Timeline

        return Timeline
    raise AttributeError(name)
