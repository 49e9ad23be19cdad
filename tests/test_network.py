"""The simulated network and streaming off (ui/chat/network.py): order kept, delays within the link's
bounds, the source read at its own pace, and a non-streamed reply delivered in one piece at the end."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from engine.core.errors import InvalidRequest
from engine.core.timeline import Timeline
from server.protocol import completion_body
from ui.chat import network, records, settings


async def source(n: int, gap_s: float, produced: list):
    for i in range(n):
        await asyncio.sleep(gap_s)
        produced.append(time.perf_counter())
        yield ("chunk", {"i": i})


def run(link, streaming, n=8, gap_s=0.01):
    produced, received = [], []

    async def main():
        async for kind, data in network.deliver(source(n, gap_s, produced), link, streaming, size=lambda e: 100,
                                                seed=1):
            received.append((time.perf_counter(), data["i"]))

    asyncio.run(main())
    return produced, received


def test_a_link_delays_every_event_within_its_bounds_and_keeps_their_order():
    link = network.Link("test", delay_ms=40, jitter_ms=10)
    produced, received = run(link, streaming=True)
    assert [i for _, i in received] == list(range(8))
    delays = [r - p for p, (r, _) in zip(produced, received)]
    assert min(delays) >= 0.030 - 0.002 and max(delays) <= 0.050 + 0.040  # ± jitter, plus scheduling slack
    # the source was read at its own pace: production is not held back by the delays
    assert produced[-1] - produced[0] < 7 * 0.01 + 0.04


def test_bandwidth_adds_the_time_to_push_the_bytes():
    slow = network.Link("slow", kbps=80)  # 100 bytes = 800 bits = 10 ms
    assert slow.one_way_s(random.Random(0), 100) == pytest.approx(0.010)
    assert network.Link("x", 5, 0, None).one_way_s(random.Random(0), 10**6) == pytest.approx(0.005)


def test_streaming_off_delivers_everything_when_the_reply_is_complete():
    produced, received = run(network.PRESETS["loopback"], streaming=False)
    assert [i for _, i in received] == list(range(8))
    assert min(t for t, _ in received) >= produced[-1]  # nothing before the last event existed


def test_loopback_with_streaming_passes_events_straight_through():
    produced, received = run(network.PRESETS["loopback"], streaming=True)
    assert all(r - p < 0.01 for p, (r, _) in zip(produced, received))


def test_network_settings_are_checked_and_labelled():
    s = settings.PaneSettings.read({"network": "custom", "net_delay_ms": 120.0, "streaming": False}).page
    assert s["net_delay_ms"] == 120 and s["streaming"] is False
    assert network.link_for(s).delay_ms == 120
    for bad in ({"network": "dialup"}, {"net_delay_ms": -1}, {"streaming": "no"}):
        with pytest.raises(InvalidRequest):
            settings.PaneSettings.read(bad)
    label = records.config_label({"temperature": 0, **s})
    assert "not streamed" in label and "network custom" in label and "delay=120" in label
    assert "delay=" not in records.config_label({"temperature": 0, "network": "4g", "net_delay_ms": 5})


def test_a_non_streamed_api_reply_says_so_in_its_timings():
    body = completion_body("c", 0, "m", "hi", "stop", Timeline())
    assert body["timings"]["streamed"] is False
