"""`python -m ui.compare.abtest`: the Sweep from the command line. A prompt set through settings A and B (or
A twice: --aa, the A/A check), counterbalanced after a warm-up pair (ui/compare/sweep.py), decided by the one
statistics module (ui/compare/stats.py) as the page decides; prints the verdict line and a line per metric
(--json: the sweep's report and rows). Settings start from an A/B pane's (greedy, 64 tokens).

  python -m ui.compare.abtest --set copy_edits --items 6 --b speculative=prompt_lookup,num_speculative_tokens=8
  python -m ui.compare.abtest --set copy_edits --items 6 --aa        # exit 1 if the A/A check names a winner

Model flags as `python -m engine` (--model, --dtype, --threads...); --paced-source TOK_PER_S runs
the page's test source instead of a model.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def parse_settings(text: str) -> dict:
    """"speculative=prompt_lookup,num_speculative_tokens=8" → {...}; values read as JSON where they
    parse (numbers, true/false), else as text."""
    out = {}
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        name, sep, value = part.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"write settings as name=value, not {part!r}")
        try:
            out[name.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[name.strip()] = value.strip()
    return out


def build_parser() -> argparse.ArgumentParser:
    from engine.cli import add_load_args

    p = argparse.ArgumentParser(prog="python -m ui.compare.abtest", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--set", default="open_questions", help="a prompt set of ui/shell/prompts/ (default: open_questions)")
    p.add_argument("--items", type=int, default=8, help="items (conversations) of the set, at most (default 8)")
    p.add_argument("--a", type=parse_settings, default={}, help="A's settings: name=value,name=value")
    p.add_argument("--b", type=parse_settings, default={}, help="B's settings (ignored with --aa)")
    p.add_argument("--aa", action="store_true", help="B = A: the A/A check")
    p.add_argument("--json", action="store_true", help="the report and rows as one JSON object")
    p.add_argument("--paced-source", type=float, default=None, metavar="TOK_PER_S",
                   help="no model: the page's test source at this rate")
    add_load_args(p)
    return p


def lines(report: dict) -> list[str]:
    """The verdict, then per metric: B/A, interval, corrected p, decision (the page's table, as text),
    then the order line (the order effect measured)."""
    from . import stats, verdict
    from ..shell.glossary import METRICS

    table = [stats.PairedRatio(**p) for p in report["paired"]]
    out = [f"verdict: {report['verdict']}"]
    for r in table:
        out.append(f"  {METRICS[r.metric].label:<16} {stats.fmt_ratio(r.ratio):>7}  {stats.interval_text(r):>11}  "
                   f"p(Holm) {stats.p_text(r.p_holm):>7}  {r.method:<5} {stats.decision_text(r)}")
    return out + [verdict.order_line(table)]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from engine.cli import load_config_from_args
    from engine.core.errors import EXIT_FAILURE, LatencyLabError, exit_code

    from . import sweep
    from ..chat.store import ChatStore
    from ..shell.presets import load_prompt_sets
    from ..chat.settings import AB_PANE, defaults

    sets = load_prompt_sets()
    if args.set not in sets:
        print(f"error: --set must be one of {', '.join(sets)}", file=sys.stderr)
        return 2
    a = {**defaults(), **AB_PANE, **args.a}
    b = dict(a) if args.aa else {**defaults(), **AB_PANE, **args.b}
    engine = None
    try:
        if args.paced_source:
            from ..chat.paced import PacedSource

            engine = PacedSource(args.paced_source)
        else:
            from engine.serving.service import Engine

            engine = Engine.load(load_config_from_args(args, progress=False))
        store = ChatStore(engine)
        rows = asyncio.run(sweep.run_sweep(store, sets[args.set], a, b, max_items=args.items, progress=lambda d, t, w:
                                           print(f"\r{d}/{t} {w}".ljust(40), end="", file=sys.stderr, flush=True)))
        print(file=sys.stderr)
        report = sweep.report(rows, store.decoder())
    except LatencyLabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_code(exc)
    finally:
        if hasattr(engine, "close"):
            engine.close()  # its worker thread ends before the interpreter does
    print(json.dumps({**report, "rows": [{k: v for k, v in r.items() if k != "token_ids"} for r in rows]})
          if args.json else "\n".join(lines(report)))
    claimed = any(p["winner"] or p["decision"] == "different" for p in report["paired"])
    return EXIT_FAILURE if args.aa and claimed else 0


if __name__ == "__main__":
    raise SystemExit(main())
