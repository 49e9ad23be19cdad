"""Open-loop clients: each request is sent at its arrival time (arrivals.py) whether or not the
earlier ones have finished, as traffic reaches a real server (vLLM's `bench serve`), so a server
slower than the offered rate grows a queue instead of slowing its clients down (closed loop:
clients.py `drive`). Each request is judged as in closed loop (pool.judge).

Requests cycle through the pool's turns, each sent on its own, without a session: a second turn
carries the first turn's reference reply as its history (pool.compute_references), so it is the
same request its reference was computed for. The probe (the user's own chat turn, key "probe") is
sent once, at `probe_at` seconds, among the level's requests and judged like them.
"""

from __future__ import annotations

import asyncio
import time

from .pool import Result, Turn, judge, one_request

PROBE = "probe"  # the probe's key: its result is the probe's, not one of the level's


def probe_time(times: list[float]) -> float:
    """Halfway between the middle two arrivals: the level's traffic is under way, and the probe does
    not arrive together with one of its requests by construction."""
    if len(times) < 2:
        return times[0] if times else 0.0
    i = len(times) // 2
    return (times[i - 1] + times[i]) / 2


async def drive_open(url: str, turns: list[Turn], times: list[float], deadline: float, api_key: str | None = None,
                     headers: dict | None = None, on_result=None, probe: Turn | None = None,
                     probe_at: float | None = None) -> tuple[list[Result], float]:
    """Send `turns[i % len(turns)]` at `times[i]` seconds after the start; return every judged
    result (the probe's too) and the wall time from the start to the last reply."""
    import httpx

    references = {t.key: t.ref_text for t in turns}
    if probe is not None:
        references[PROBE] = probe.ref_text
    results: list[Result] = []
    headers = {**({"Authorization": f"Bearer {api_key}"} if api_key else {}), **(headers or {})}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)  # never a cap: that is closed loop
    async with httpx.AsyncClient(timeout=httpx.Timeout(deadline + 30, connect=10), limits=limits,
                                 headers=headers) as http:
        t0 = time.perf_counter()

        async def send(turn: Turn, at: float) -> None:
            delay = t0 + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            sent = time.perf_counter() - t0
            r = await one_request(http, url, turn, None, None, deadline, 0)
            r.sent_s = round(sent, 4)
            r.outcome = judge(r, turn, references)
            results.append(r)
            if on_result is not None:
                on_result(r)

        tasks = [send(turns[i % len(turns)], t) for i, t in enumerate(times)]
        if probe is not None:
            tasks.append(send(probe, probe_at if probe_at is not None else probe_time(times)))
        await asyncio.gather(*tasks)
        return results, time.perf_counter() - t0
