"""Simulated network conditions on the page's own transport (stage 1 and stage 6 of the budget).

The page's /lab/chat request waits one simulated one-way trip before the server stamps it as
received (network in), and every event of the reply stream is delivered one one-way trip after the
server handed it over (network out), through a link of limited bandwidth, in order. The engine runs
at its own pace behind a queue, so the server's figures (TTFT, TPOT, e2e) do not change: what
changes is network in, network out and everything the browser perceives.

With streaming off the reply's events are held until the reply is complete and then sent at once,
as a non-streaming HTTP response would be: the reader's first word arrives at the total time.

Simulated, not measured: the glossary says so, and the clock-offset pings are never delayed (so
the page's estimate of network in/out shows the simulated delay).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Link:
    """A one-way delay with jitter (uniform ± jitter_ms, never below 0) and a bandwidth cap."""

    name: str
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    kbps: float | None = None  # kilobits per second; None: unlimited

    @property
    def simulated(self) -> bool:
        return bool(self.delay_ms or self.jitter_ms or self.kbps)

    def one_way_s(self, rng: random.Random, nbytes: int = 0) -> float:
        """One trip's delay: propagation with jitter plus the time to push `nbytes` through the link."""
        jitter = rng.uniform(-self.jitter_ms, self.jitter_ms) if self.jitter_ms else 0.0
        serialize = nbytes * 8 / (self.kbps * 1000) if self.kbps else 0.0
        return max(0.0, self.delay_ms + jitter) / 1e3 + serialize

    def describe(self) -> str:
        if not self.simulated:
            return "loopback (no simulated delay)"
        parts = [f"{self.delay_ms:g} ms one way"]
        if self.jitter_ms:
            parts.append(f"± {self.jitter_ms:g} ms")
        if self.kbps:
            parts.append(f"{self.kbps / 1000:g} Mbit/s" if self.kbps >= 1000 else f"{self.kbps:g} kbit/s")
        return f"{self.name}: " + ", ".join(parts)


# Typical one-way figures (propagation + access), for teaching, not a standard.
PRESETS = {
    "loopback": Link("loopback"),
    "lan": Link("LAN", 1, 0.2, 100_000),
    "wifi": Link("Wi-Fi", 15, 5, 50_000),
    "4g": Link("4G", 50, 15, 10_000),
    "satellite": Link("satellite", 300, 20, 5_000),
}
NETWORKS = (*PRESETS, "custom")


def link_for(settings: dict) -> Link:
    """The pane's link: a preset, or 'custom' from net_delay_ms / net_jitter_ms / net_kbps."""
    name = settings.get("network") or "loopback"
    if name != "custom":
        return PRESETS[name]
    kbps = settings.get("net_kbps") or 0
    return Link("custom", float(settings.get("net_delay_ms") or 0), float(settings.get("net_jitter_ms") or 0),
                float(kbps) if kbps > 0 else None)


async def deliver(events: AsyncIterator, link: Link, streaming: bool, size, seed: int | None = None):
    """Yield `events` as the browser would receive them over `link`.

    A producer task reads the source as fast as the server produces (so its own timings stay
    as they are); each event is due one simulated trip after it was handed over, and no earlier
    than the event before it (one TCP stream keeps order). Without streaming, every event is due
    when the last one was produced. `size(event)` gives an event's bytes on the wire.
    """
    if not link.simulated and streaming:
        async for event in events:
            yield event
        return
    rng = random.Random(seed)
    queue: asyncio.Queue = asyncio.Queue()
    held: list = []
    end = object()

    async def produce():
        due_prev = 0.0
        try:
            async for event in events:
                now = time.perf_counter()
                if not streaming:
                    held.append(event)
                    continue
                trip = link.one_way_s(rng, size(event))
                due_prev = max(due_prev, now + trip)
                await queue.put((due_prev, event))
            if held:
                now = time.perf_counter()
                due = now + link.one_way_s(rng, sum(size(e) for e in held))
                for event in held:
                    await queue.put((due, event))
        finally:
            await queue.put((0.0, end))

    task = asyncio.create_task(produce())
    try:
        while True:
            due, event = await queue.get()
            if event is end:
                break
            wait = due - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            yield event
        await task  # re-raise what the source raised
    finally:
        if not task.done():
            task.cancel()
