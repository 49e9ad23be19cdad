"""Finished requests' traces for the API (`GET /v1/trace/{id}`) and their OpenTelemetry export.

Every request an instrumented backend serves (the API's and the page's: server/metrics.py reports
each one once, at its final event) is kept here by id, the latest `keep`, and, with an OTLP
endpoint, exported as spans (engine/measure/otel.py). A page reply's browser timings join its
Timeline later (ui/chat/store.py), so its trace fetched afterwards has the browser and network tracks too.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from engine.measure.trace import chrome_trace

KEEP = 1000  # finished requests whose trace can be fetched by id


class RequestTraces:
    def __init__(self, otlp=None, keep: int = KEEP):
        self.otlp, self.keep = otlp, keep
        self._timelines: OrderedDict[str, object] = OrderedDict()
        self._aliases: OrderedDict[str, str] = OrderedDict()  # completion id (chatcmpl-...) → request id
        self._lock = threading.Lock()

    def watch(self, metrics) -> None:
        """Hear of every finished request: `metrics` tells its listeners once per request."""
        metrics.listeners.append(self.finished)

    def finished(self, timeline, model_name: str) -> None:
        with self._lock:
            self._timelines[timeline.request_id] = timeline
            while len(self._timelines) > self.keep:
                self._timelines.popitem(last=False)
        if self.otlp is not None:
            self.otlp.export(timeline, model_name)

    def alias(self, completion_id: str, request_id: str) -> None:
        with self._lock:
            self._aliases[completion_id] = request_id
            while len(self._aliases) > self.keep:
                self._aliases.popitem(last=False)

    def timeline(self, some_id: str):
        with self._lock:
            return self._timelines.get(self._aliases.get(some_id, some_id))

    def trace(self, some_id: str) -> dict | None:
        """The Chrome Trace Event JSON of a finished request (by X-Request-Id or completion id)."""
        tl = self.timeline(some_id)
        return None if tl is None else chrome_trace([tl.to_dict()])
