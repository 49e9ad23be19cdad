"""The load runs of this app, closed-loop pairs and open-loop sweeps alike, in one table: one run at a
time (two would measure each other), the latest few kept for the page to poll."""

from __future__ import annotations

import threading
from collections import OrderedDict

from engine.core.errors import InvalidRequest, LatencyLabError

ACTIVE = ("references", "running")


class LoadBusy(LatencyLabError):
    """A second load run while one is going (the page answers 409)."""


class Runs:
    def __init__(self, keep: int = 8):
        self.keep = keep
        self._runs: OrderedDict[str, object] = OrderedDict()
        self._lock = threading.Lock()

    def busy(self) -> bool:
        return any(r.status in ACTIVE for r in self._runs.values())

    def start(self, run, work, name: str, what: str):
        """Register `run` and start `work(run)` on a thread of its own, unless a run is going (LoadBusy).
        `run` has `status`, `message` and a `stop` event: when `work` returns it is done (or stopped); when
        it raises, an error the tab shows, never a traceback ("{what} failed: …" for a bug or a backend down)."""
        with self._lock:
            if self.busy():
                raise LoadBusy("a load run is already going on this server (maybe from another tab): "
                               "wait for it to finish, or stop it there")
            self._runs[run.id] = run
            while len(self._runs) > self.keep:
                self._runs.popitem(last=False)
        threading.Thread(target=_finished, args=(run, work, what), name=name, daemon=True).start()
        return run

    def get(self, run_id: str, kind: type, missing: str):
        """The run `run_id`, if it is a `kind`; else an InvalidRequest saying `missing`."""
        run = self._runs.get(run_id)
        if not isinstance(run, kind):
            raise InvalidRequest(missing, "id")
        return run


def _finished(run, work, what: str) -> None:
    try:
        work(run)
        run.status = "stopped" if run.stop.is_set() else "done"
        run.message = "stopped" if run.stop.is_set() else ""
    except LatencyLabError as exc:
        run.status, run.message = "error", str(exc)
    except Exception as exc:  # a bug or a backend down: said on the tab, never a traceback there
        run.status, run.message = "error", f"{what} failed: {type(exc).__name__}: {exc}"
