"""`python -m engine "PROMPT"`: stream a reply to the terminal, then one line of timings.

Without a prompt it is an interactive multi-turn chat. `--json` prints exactly one JSON object,
`{"text": ..., "timeline": {...}}`. `--trace FILE` writes the reply's trace (Chrome Trace Event JSON:
open it in ui.perfetto.dev; a chat's turns all go in one file, rewritten after each). The flag builders here are shared by the bench and app.py.
`pip install .` also installs it as the `latency-lab-cli` command (usage still reads `python -m
engine`: one name for both).
"""

from __future__ import annotations

import argparse
import json
import sys

from engine.core.config import (
    DEVICES,
    DTYPES,
    SAMPLING,
    TOGGLES,
    GenerationConfig,
    LoadConfig,
    parse_kv_cache_mb,
)
from engine.core.errors import EXIT_OK, InvalidRequest, LatencyLabError, exit_code
from engine.serving.sessions import Conversation


_ITEMS = {int: "a whole number", float: "a number"}  # what comma_list's message calls an item convert refuses


def comma_list(convert=str, least=None):
    """An argparse `type` for a comma-separated flag ("1,4,8"): a list of convert(item), blank items dropped,
    the one parser of every list flag (this CLI's, the benches'). An item convert refuses, or one below `least`,
    is argparse's error naming the flag and the item (exit 2), not a traceback."""

    def parse(text: str) -> list:
        items = []
        for part in (p.strip() for p in text.split(",")):
            if not part:
                continue
            try:
                value = convert(part)
            except ValueError:
                raise argparse.ArgumentTypeError(
                    f"{part!r} is not {_ITEMS.get(convert, 'valid here')} (a comma-separated list)") from None
            if least is not None and value < least:
                raise argparse.ArgumentTypeError(f"{part} is below {least} (a comma-separated list)")
            items.append(value)
        return items

    return parse


def add_load_args(p: argparse.ArgumentParser, max_batch: int = LoadConfig.max_batch) -> None:
    """The model flags; `max_batch`: --max-batch's default (the servers batch: server.cli.DEFAULT_MAX_BATCH)."""
    g = p.add_argument_group("model")
    g.add_argument("--model", default=None,
                   help="a model folder, a .gguf file or a hub id (default: bundled SmolLM2-135M-Instruct)")
    g.add_argument("--dtype", default="auto", choices=DTYPES, help="weights and activations (default: auto)")
    g.add_argument("--device", default="auto", choices=DEVICES,
                   help="auto: $LATENCY_LAB_DEVICE if set, else the GPU where torch can use one, else CPU; the start "
                        "line and engine info say which serves and why (`python -m engine.platform.device` prints it)")
    g.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    g.add_argument("--no-fast-path", action="store_true",
                   help="use the generic transformers forward instead of our Llama-family forward")
    g.add_argument("--kv-cache-mb", type=parse_kv_cache_mb, default=LoadConfig.kv_cache_mb,
                   help="memory budget of the prefix cache (KV reuse) in MiB; 0 keeps nothing (default: auto: half "
                        "the GPU memory free after the model loads, on CPU 512 MiB or a quarter of the available "
                        "memory if less; engine info says which)")
    g.add_argument("--shared-prefix-cache", action="store_true",
                   help="share cached prefixes between sessions (default: each session sees only its own; "
                        "sharing lets one user infer by timing what another's prompt began with)")
    g.add_argument("--variants", default="", type=comma_list(),
                   help="quantization variants to build at start, e.g. int8,nf4 (others are built on first use)")
    g.add_argument("--variants-budget-mb", type=float, default=None,
                   help="memory for the weights of all resident variants (default: 3x the loaded model's)")
    g.add_argument("--draft-model", default=None, metavar="PATH",
                   help="draft for --speculative draft: a causal LM folder sharing the model's tokenizer "
                        "(default: the bundled distilled draft for the bundled model; 'none': no draft)")
    g.add_argument("--max-batch", type=int, default=max_batch, metavar="N",
                   help="continuous batching: decode up to N requests together in one forward (default: %(default)s; "
                        "1: one request at a time); speculative requests run unbatched beside the batch")


def load_config_from_args(args, progress: bool = True) -> LoadConfig:
    return LoadConfig(model=args.model, dtype=args.dtype, device=args.device, threads=args.threads,
                      fast_path=not args.no_fast_path, progress=progress, kv_cache_mb=args.kv_cache_mb,
                      shared_prefix_cache=args.shared_prefix_cache,
                      variants=tuple(args.variants),
                      variants_budget_mb=args.variants_budget_mb,
                      draft_model=getattr(args, "draft_model", None),
                      max_batch=getattr(args, "max_batch", LoadConfig.max_batch))


def add_generation_args(p: argparse.ArgumentParser) -> None:
    """One flag per declared field (engine/core/config.py), with its default; its bounds are checked
    by `GenerationConfig` when it is made (an error naming the field, exit code 2)."""
    g = p.add_argument_group("generation")
    for t in (*SAMPLING, *TOGGLES):
        if t.kind == "bool" and t.default:
            g.add_argument("--no-" + t.cli_flag[2:], dest=t.name, action="store_false", help=f"off: {t.help}")
        elif t.kind == "bool":
            g.add_argument(t.cli_flag, dest=t.name, action="store_true", help=t.help)
        elif t.kind == "strings":  # default None: append never adds to a shared default list
            g.add_argument(t.cli_flag, dest=t.name, action="append", default=None, help=t.help)
        else:
            g.add_argument(t.cli_flag, dest=t.name, default=t.default, help=f"{t.help} (default: %(default)s)",
                           type={"int": int, "float": float}.get(t.kind, str), choices=t.choices or None)
    g.add_argument("--system", default=None, help="system prompt")


def generation_config_from_args(args) -> GenerationConfig:
    given = {t.name: getattr(args, t.name) for t in (*SAMPLING, *TOGGLES)}
    given.update({t.name: tuple(given[t.name] or t.default) for t in SAMPLING if t.kind == "strings"})
    return GenerationConfig(**given)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine", description=__doc__.splitlines()[0])
    p.add_argument("prompt", nargs="?", help="the message to answer (omit for an interactive chat)")
    p.add_argument("--json", action="store_true", help="print only one JSON object: text and timeline")
    p.add_argument("--trace", default=None, metavar="FILE",
                   help="write the reply's trace (every server step on one clock) as Chrome Trace Event JSON, for "
                        "ui.perfetto.dev or chrome://tracing (a chat: every turn, rewritten after each)")
    add_load_args(p)
    add_generation_args(p)
    return p


def _messages(system: str | None, history: list[dict]) -> list[dict]:
    return ([{"role": "system", "content": system}] if system else []) + history


def _answer(engine, messages, gen, stream_to=None, session: str = "cli"):
    """Run one request; stream its text to `stream_to`; return the done event."""
    handle = engine.submit(messages, gen, session=session)
    for event in handle.events():
        if event.kind == "chunk" and stream_to is not None:
            stream_to.write(event.text)
            stream_to.flush()
        elif event.kind == "error":
            raise event.detail.get("exception") or LatencyLabError(event.detail["message"])
    return handle.final


def _write_trace(path: str | None, timelines: list) -> None:
    if path is None:
        return
    from engine.measure.trace import chrome_trace

    turns = [(f"turn {i + 1}" if len(timelines) > 1 else None, tl.to_dict()) for i, tl in enumerate(timelines)]
    with open(path, "w") as f:
        json.dump(chrome_trace(turns), f)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from engine.lab import open_engine

    try:
        gen = generation_config_from_args(args)
        if args.prompt is not None and not args.prompt.strip():
            raise InvalidRequest("the prompt is empty: pass a message, or no argument for a chat", "prompt")
        engine = open_engine(load_config_from_args(args, progress=not args.json))
    except LatencyLabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_code(exc)
    try:
        if args.prompt is None:
            return _chat(engine, args, gen)
        done = _answer(engine, _messages(args.system, [{"role": "user", "content": args.prompt}]), gen,
                       None if args.json else sys.stdout)
        _write_trace(args.trace, [done.timeline])
        if args.json:
            print(json.dumps({"text": done.text, "model": engine.info().to_dict(), "timeline": done.timeline.to_dict()}))
        else:
            print(f"\n[{done.timeline.summary()}]", file=sys.stderr)
        return EXIT_OK
    except LatencyLabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_code(exc)
    finally:
        engine.close()


def _chat(engine, args, gen) -> int:
    info = engine.info()
    if info.capabilities:
        print(f"this machine: {info.capabilities['summary']}", file=sys.stderr)
    if info.device_reason:
        print(f"device: {info.device_reason}", file=sys.stderr)
    print(f"{info.name} ({info.dtype}, {info.device}, loaded in {info.load_s:.1f}s). "
          "Type a message; /reset starts over, Ctrl-D quits.", file=sys.stderr)
    # The conversation lives here, replies exactly as generated, in one prefix-cache session:
    # each turn prefills only the new tokens (see the `cached` figure in the summary line).
    conv = Conversation("cli-chat", args.system)
    timelines = []
    while True:
        try:
            line = input("\n> ")
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return 0
        if line.strip() == "/reset":
            conv.clear()
            continue
        if not line.strip():
            continue
        try:
            done = _answer(engine, conv.send(line), gen, sys.stdout, session=conv.session)
        except LatencyLabError as exc:
            conv.drop_unanswered()
            print(f"error: {exc}", file=sys.stderr)
            continue
        conv.add_reply(done)
        print(f"\n[{done.timeline.summary()}]", file=sys.stderr)
        timelines.append(done.timeline)
        _write_trace(args.trace, timelines)
