"""`python -m server.bench load --request-rate ...`: the open-loop load, its flags named as
`vllm bench serve` names them where the concept is the same (`--request-rate`, `--burstiness`,
`--num-prompts`, `--goodput`, `--percentile-metrics`, `--metric-percentiles`, `--seed`), and its
printout. The load itself: server/load/sweep.py (levels, knee), open_loop.py (the clients),
serve_figures.py (the figures, vLLM's field names), pareto.py, open_scenario.py (what it runs against).

    --request-rate 2            one level: 2 requests/s offered (Poisson), --num-prompts of them
    --request-rate 0.5,1,2      those levels
    --request-rate sweep        from a low rate up to saturation, automatically (sweep.py)
    --compare-max-batch 1,4,8   a sweep per max batch, and the Pareto trade-off between them
    --base-url URL/v1 --remote-model NAME   against a remote OpenAI-compatible server, client side
"""

from __future__ import annotations

import math
import os

from engine.cli import comma_list
from server.load.open_scenario import PROBE_PROMPT, run_local, run_remote
from server.load.serve_figures import (
    DEFAULT_OBJECTIVES,
    DEFAULT_PERCENTILES,
    PERCENTILE_METRICS,
    parse_goodput,
)
from server.load.sweep import SweepSettings


def add_args(p) -> None:
    g = p.add_argument_group("open loop (vllm bench serve's names)")
    g.add_argument("--request-rate", default=None,
                   help="open loop: requests/s offered (a number, inf, a comma list of levels, or 'sweep': from a "
                        "low rate up to saturation); without it the load is closed loop (--levels clients)")
    g.add_argument("--burstiness", type=float, default=1.0,
                   help="gamma shape of the inter-arrival times: 1 Poisson, <1 burstier, >1 more regular")
    g.add_argument("--arrivals", choices=("poisson", "constant"), default="poisson",
                   help="constant: requests exactly 1/rate apart")
    g.add_argument("--num-prompts", type=int, default=16, help="requests per level (open loop)")
    g.add_argument("--seed", type=int, default=0, help="the arrival schedule's seed")
    g.add_argument("--goodput", nargs="+", default=[f"{k}:{v:g}" for k, v in DEFAULT_OBJECTIVES.items()],
                   metavar="NAME:MS", help="objectives: ttft, tpot, e2el in ms; goodput = requests/s meeting all of "
                                           "them (default: TTFT 2 s, TPOT at the page's reading pace)")
    g.add_argument("--percentile-metrics", default=",".join(PERCENTILE_METRICS), type=comma_list())
    g.add_argument("--metric-percentiles", default=",".join(map(str, DEFAULT_PERCENTILES)),
                   type=comma_list(float, 0))
    g.add_argument("--sweep-start", type=float, default=None,
                   help="the sweep's first rate (default: half of what one request at a time serves)")
    g.add_argument("--sweep-factor", type=float, default=SweepSettings.factor, help="each level's rate is the last one's times this")
    g.add_argument("--sweep-levels", type=int, default=SweepSettings.max_levels, help="at most this many levels")
    g.add_argument("--sweep-max-rate", type=float, default=None, help="no level above this rate")
    g.add_argument("--probe", default=PROBE_PROMPT,
                   help="a chat turn sent once at each level, its stages reported per level ('' : none)")
    g.add_argument("--base-url", default=None, help="a remote OpenAI-compatible server's API root (…/v1)")
    g.add_argument("--remote-model", default=None, help="the model name the remote server serves")
    g.add_argument("--remote-api-key", default=os.environ.get("OPENAI_API_KEY"))


def settings(args) -> SweepSettings:
    from engine.core.errors import InvalidRequest

    try:
        objectives = parse_goodput(args.goodput)
    except ValueError as exc:
        raise InvalidRequest(str(exc), "goodput") from exc
    rate = args.request_rate.strip().lower()
    try:
        rates = () if rate == "sweep" else tuple(math.inf if x.strip() == "inf" else float(x)
                                                 for x in rate.split(",") if x.strip())
    except ValueError:
        rates = (0.0,)
    if any(not r > 0 for r in rates) or not args.burstiness > 0:
        raise InvalidRequest("--request-rate takes 'sweep', inf, or rates > 0 (a comma list); --burstiness > 0",
                             "request_rate")
    metrics = tuple(args.percentile_metrics)
    if set(metrics) - set(PERCENTILE_METRICS):
        raise InvalidRequest(f"--percentile-metrics: one or more of {', '.join(PERCENTILE_METRICS)}",
                             "percentile_metrics")
    return SweepSettings(rates=rates, start_rate=args.sweep_start, factor=args.sweep_factor,
                         max_levels=args.sweep_levels, max_rate=args.sweep_max_rate,
                         num_prompts=None if args.duration is not None else args.num_prompts,
                         duration=args.duration, burstiness=args.burstiness, process=args.arrivals,
                         seed=args.seed, objectives=objectives, deadline=args.deadline, percentile_metrics=metrics,
                         percentiles=tuple(args.metric_percentiles))


def run(args, out) -> dict:
    from engine.bench import load_model

    s = settings(args)
    probe = args.probe or None
    out(f"open loop: {'sweep' if not s.rates else ', '.join(map(str, s.rates)) + ' req/s'}, "
        f"{s.process}{' burstiness ' + str(s.burstiness) if s.process == 'poisson' else ''}, "
        f"{s.num_prompts} requests per level, goodput objectives {s.objectives} ms")
    if args.base_url:
        from engine.core.errors import InvalidRequest

        if not args.remote_model:
            raise InvalidRequest("--base-url needs --remote-model NAME", "remote_model")
        result = run_remote(s, args.base_url, args.remote_model, args.remote_api_key,
                            conversations=args.conversations, max_new_tokens=args.max_new_tokens,
                            probe_prompt=probe, out=out)
    else:
        batches = args.compare_max_batch or [args.max_batch]
        result = run_local(load_model(args), s, batches, conversations=args.conversations,
                           max_new_tokens=args.max_new_tokens, probe_prompt=probe, max_queue=args.max_queue,
                           kv_cache_mb=args.kv_cache_mb, shared_prefix_cache=args.shared_prefix_cache, out=out)
    for name, sweep in result["sweeps"].items():
        out(f"{name}: probe per level (queue / prefill / decode ms, mean batch shared): " + "; ".join(
            f"{r['request_rate']:g} req/s: " + ("-" if p is None else
                                                 f"{_f(p['queue_ms'])} / {_f(p['prefill_ms'])} / {_f(p['decode_ms'])}"
                                                 f", batch {_f(p['batch_size_mean'])} ({p['outcome']})")
            for r, p in zip(sweep["levels"], sweep["probes"])))
    return {"mode": "open", "request_rate": args.request_rate, "burstiness": s.burstiness, "arrivals": s.process,
            "num_prompts": s.num_prompts, "seed": s.seed, **result}


def _f(v) -> str:
    return "-" if v is None else f"{v:,.0f}" if abs(v) >= 10 else f"{v:.2f}"
