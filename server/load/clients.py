"""The load's clients (`drive`), in a process of their own as real clients are (`drive_elsewhere`).

Why: clients on a thread of the server's process share its interpreter lock with the worker
thread that drives the model, and the more tokens the server streams, the more the clients' own
parsing holds that lock: a load measured so penalizes the faster configuration (`python -m
server.bench load` shows it; figures in docs/history.md, "Batching: earlier figures"). The clients
still share the machine's cores with the server, as a browser on the same laptop would.

The parent sends the pool (each turn with its reference reply) and the run's settings as one JSON
object on stdin; the child runs `drive` and writes one JSON line per judged request,
then one with the wall time. `python -m server.load.clients` is that child; it runs closed-loop
clients (`drive`) or open-loop arrivals (open_loop.py `drive_open`), as the spec's "mode" says.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from dataclasses import asdict

from .pool import Result, ScriptedConversation, Turn, judge, one_request
from .reuse import ThinkTime

CHILD = "server.load.clients"  # this module, as `drive_elsewhere` runs it in a process of its own


async def drive(url: str, pool: list[ScriptedConversation], clients: int, duration: float, max_requests: int,
                cancel_every: int, deadline: float, api_key: str | None = None, headers: dict | None = None,
                on_result=None, think: ThinkTime | None = None) -> tuple[list[Result], float]:
    """`clients` clients play conversations until `duration` is up (then finish what they sent).
    `headers`: sent with every request (the page forwards its own auth); `on_result(result)`: called
    as each request is judged (the page's live plots); `think`: the pause between a reply's end and
    its conversation's next turn (server/load/reuse.py; none before a conversation's first turn)."""
    import httpx

    references = {t.key: t.ref_text for c in pool for t in c.turns}
    results: list[Result] = []
    sent = 0
    headers = {**({"Authorization": f"Bearer {api_key}"} if api_key else {}), **(headers or {})}
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(deadline + 30, connect=10), limits=limits,
                                 headers=headers) as http:
        t0 = time.perf_counter()
        end = t0 + duration

        async def client(c: int) -> None:
            nonlocal sent
            i = 0
            rng = think.rng(c) if think is not None else None
            while time.perf_counter() < end and sent < max_requests:
                conv = pool[(c + i * clients) % len(pool)]
                i += 1
                session = None
                if conv.with_session:
                    resp = await http.post(url + "/v1/sessions")
                    session = resp.json()["id"]
                for j, turn in enumerate(conv.turns):
                    pause = think.draw(rng) if think is not None and j else None
                    if pause:
                        await asyncio.sleep(pause)
                    if sent >= max_requests:
                        return
                    sent += 1
                    cancel = None
                    if cancel_every and sent % cancel_every == 0:
                        cancel = "queued" if (sent // cancel_every) % 2 else "midway"
                    r = await one_request(http, url, turn, session, cancel, deadline, clients)
                    r.think_s = pause
                    r.outcome = judge(r, turn, references)
                    results.append(r)
                    if on_result is not None:
                        on_result(r)

        await asyncio.gather(*(client(c) for c in range(clients)))
        return results, time.perf_counter() - t0


def drive_elsewhere(url: str, pool: list[ScriptedConversation], clients: int, duration: float, max_requests: int,
                    cancel_every: int, deadline: float, api_key: str | None = None, headers: dict | None = None,
                    on_result=None, stop: threading.Event | None = None,
                    think: ThinkTime | None = None) -> tuple[list[Result], float]:
    """`drive` with the same arguments, run by a child process. `stop`: set it to end the
    run early (the child is killed; its open streams close, so the server cancels their generations)."""
    spec = {"mode": "closed", "url": url, "pool": [asdict(c) for c in pool], "clients": clients,
            "duration": duration, "max_requests": max_requests, "cancel_every": cancel_every, "deadline": deadline,
            "api_key": api_key, "headers": headers or {}, "think": think.to_dict() if think is not None else None}
    return run_child(spec, on_result, stop)


def drive_open_elsewhere(url: str, turns: list[Turn], times: list[float], deadline: float,
                         api_key: str | None = None, headers: dict | None = None, on_result=None,
                         stop: threading.Event | None = None, probe: Turn | None = None,
                         probe_at: float | None = None) -> tuple[list[Result], float]:
    """open_loop.drive_open with the same arguments, run by a child process (as `drive_elsewhere`)."""
    spec = {"mode": "open", "url": url, "turns": [asdict(t) for t in turns], "times": list(times),
            "deadline": deadline, "api_key": api_key, "headers": headers or {},
            "probe": asdict(probe) if probe is not None else None, "probe_at": probe_at}
    return run_child(spec, on_result, stop)


def run_child(spec: dict, on_result=None, stop: threading.Event | None = None) -> tuple[list[Result], float]:
    """Run the clients `spec` describes in `python -m server.load.clients`; results as they come."""
    child = subprocess.Popen([sys.executable, "-m", CHILD], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watcher = None
    if stop is not None:
        watcher = threading.Thread(target=_kill_on, args=(stop, child), name="load-clients-stop", daemon=True)
        watcher.start()
    child.stdin.write(json.dumps(spec))
    child.stdin.close()
    results, wall = [], None
    for line in child.stdout:
        message = json.loads(line)
        if "result" in message:
            result = Result(**message["result"])
            results.append(result)
            if on_result is not None:
                on_result(result)
        else:
            wall = message["wall"]
    errors = child.stderr.read()
    child.wait()
    if wall is None and not (stop is not None and stop.is_set()):
        raise RuntimeError(f"the load's client process failed (exit {child.returncode}): "
                           f"{errors.strip().splitlines()[-1] if errors.strip() else 'no message'}")
    return results, wall if wall is not None else 0.0


def _kill_on(stop: threading.Event, child: subprocess.Popen) -> None:
    while child.poll() is None:
        if stop.wait(0.1):
            child.kill()
            return


def _pool(data: list[dict]) -> list[ScriptedConversation]:
    return [ScriptedConversation(c["index"], c["with_session"], [Turn(**t) for t in c["turns"]]) for c in data]


def main() -> None:
    spec = json.loads(sys.stdin.read())

    def on_result(result: Result) -> None:
        print(json.dumps({"result": asdict(result)}), flush=True)

    if spec.get("mode") == "open":
        from .open_loop import drive_open

        probe = Turn(**spec["probe"]) if spec.get("probe") else None
        run = drive_open(spec["url"], [Turn(**t) for t in spec["turns"]], spec["times"], spec["deadline"],
                         spec["api_key"], spec["headers"], on_result=on_result, probe=probe,
                         probe_at=spec.get("probe_at"))
    else:
        think = ThinkTime(**spec["think"]) if spec.get("think") else None
        run = drive(spec["url"], _pool(spec["pool"]), spec["clients"], spec["duration"], spec["max_requests"],
                    spec["cancel_every"], spec["deadline"], spec["api_key"], spec["headers"], on_result=on_result,
                    think=think)
    _, wall = asyncio.run(run)
    print(json.dumps({"wall": wall}), flush=True)


if __name__ == "__main__":
    main()
