"""The entry points' engine: `open_engine(config)` loads the model and its draft, opens an Engine and
attaches the measuring tools that sit above the runtime. The runtime records each reply's work
(engine/serving/work.py); the machine's limits (engine/measure/machine_limits.py: probed once per
machine and device, cached) are stamped beside it by a publisher registered here (`attach`), which the
worker calls as a reply finishes. app.py, `python -m server`, the page's bench tab, the CLI and the
benches open engines through here; nothing under the runtime imports it."""

from __future__ import annotations

from engine.core.config import LoadConfig
from engine.measure.machine_limits import load_or_measure, probe_dtypes
from engine.measure.roofline import Roofline
from engine.model.loader import cache_root
from engine.serving.service import Engine


def open_engine(config: LoadConfig = LoadConfig(), max_queue: int | None = None) -> Engine:
    """An Engine over the model `config` names, with this machine's limits attached (the cached probe,
    or a probe of a few seconds at the first start on this machine)."""
    engine = Engine.load(config, max_queue=max_queue)
    loaded = engine.loaded
    limits = load_or_measure(cache_root(config), loaded.device, probe_dtypes(loaded.dtype_name, loaded.device))
    return attach(engine, limits, cache_root(config))


def attach(engine: Engine, limits, cache_dir=None) -> Engine:
    """Give `engine` the machine's limits: engine info shows them, each reply's Timeline gets them beside
    its counts (the roofline's fractions), and `engine.remeasure_limits` probes again into `cache_dir`.
    Attaching again replaces the limits (the publisher is registered once)."""
    if engine.limits is None:
        engine.on_done(lambda timeline, variant: engine.limits is not None and engine.limits(timeline, variant))
        engine.on_idle(lambda: engine.limits is not None and engine.limits.idle())
    engine.limits = Roofline(limits, cache_dir)
    return engine
