"""The load generator: N concurrent streaming clients (closed loop) or requests arriving at a rate
(open loop) through an OpenAI-compatible API, each reply
judged against the same request alone. `python -m server.bench load` runs it from the command line
(server/bench/load.py: the flags and the printout); the page's Load tab runs it too (ui/load/).

Module map, in the order a load runs:
    pool.py      the conversations (two turns, or N; mixed toggles), their references (each request
                 alone, in-process, first) and the judge (exact, differs, cancelled, lost, crossed,
                 mismatched, stuck); one request streamed (`one_request`)
    reuse.py     KV reuse under load: think time between turns, the KV budget knob, per level the
                 prefix cache's hit rate and evictions, follow-up vs first-turn TTFT, the sentence
    clients.py   `drive`: the clients on an event loop; `drive_elsewhere`: the same in a child process
                 (`python -m server.load.clients`), as real clients are
    drive.py     `run_load`: every level, `repeat` times, the worker idle after each, memory sampled
    scenario.py  the engines a bench load serves itself: one (`run_one`) or one per max batch side by
                 side (`run_side_by_side`), each behind our API on loopback
    figures.py   a row per level (`level_row`: counts, throughput, percentiles of the server's
                 `timings`; unknown values None), tables, repeats merged, two max batches compared

Open loop (requests arriving at a rate, `--request-rate`; docs/load.md):
    arrivals.py       the schedule: gamma gaps as vLLM's bench serve draws them, or constant, seeded
    open_loop.py      `drive_open`: each request sent at its time, judged; the probe among them
    serve_figures.py  a level's figures under vLLM's names, goodput, the knee, the stop rule
    sweep.py          `Sweep`: levels of rate up to saturation, the probe's stages per level
    pareto.py         tok/s per user against total, and the sentence
    open_scenario.py  the sweeps per max batch against our engines, or against a remote server

Against a server while it serves (the page's Load tab):
    runs.py           the page's one door into this package: a closed-loop run or a sweep per max batch
                      under a batch scope of its own on the engine, the conversations and their references

The bench imports this package, never the other way round; the page imports runs.py, never server.bench.
"""
