"""`latency-lab report` (also `python -m engine.bench report`): measure this machine in one command.

A fixed suite, each step one of the existing benches run as its own command (the command is
recorded, and each starts from a fresh process, as a user running it would): the machine's limits
(the one probe the page, the API and the benches divide by, measured again with more rounds);
decode per weights variant against the read bandwidth (`bench bandwidth`); KV reuse (`bench kv`);
prompt lookup (`bench lookup`); continuous batching at max batch 1 and 8 (`python -m server.bench
load`: a subprocess, as engine/ imports no server code); ours against llama.cpp where its venv is
given (`--peer-python`, or $LLAMA_CPP_PYTHON: `bench peer`), and against ONNX Runtime GenAI too where
$ORT_GENAI_PYTHON and $ORT_GENAI_MODELS name its venv and exported models (engine/bench/peer_ort.py); and, where CUDA is present, the prepared
GPU check (`bench gpu`, docs/gpu.md: the GPU's limits, decode per variant, the graph step, its targets). About 10 minutes on 2 cores; `--quick` runs each step at its smallest
(the tests' mode: figures too short to quote).

It writes one dated folder (default `<cache>/reports/`, the engine's cache folder; `--out`):
report.md (the table, the machine, the versions, each command), report.html (the same with its plots
inline: one self-contained file to share, opened offline), report.json (every step's raw JSON),
plots/*.svg and logs/*.log (each step's own output). `--readme` rewrites the README's results
table (between its markers) from it; `--from DIR` renders an existing report again (no run).
The page's header links the newest report.html (`GET /lab/report.html`: `latest()`, `html_of()`).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from engine.cli import comma_list
from engine.bench import report_render as render

README_BEGIN, README_END = "<!-- report:begin -->", "<!-- report:end -->"


@dataclass
class Step:
    name: str
    what: str  # the row's label in the table
    module: str  # python -m MODULE
    argv: list[str]
    quick: list[str] = field(default_factory=list)  # replaces `argv` with --quick
    load_flags: bool = True  # takes the model flags (--model, --dtype, --device, --threads)

    def command(self, quick: bool, forward: list[str]) -> list[str]:
        own = self.quick if quick else self.argv
        if "--device" in own and "--device" in forward:  # the step names its own device (the GPU's steps)
            i = forward.index("--device")
            forward = forward[:i] + forward[i + 2:]
        return [self.module, *own, *(forward if self.load_flags else []), "--json"]


def suite(peer_python: str | None, cuda: bool) -> list[Step]:
    """The fixed suite: what a reader of the README wants to know about their own machine."""
    steps = [
        Step("limits", "the machine's limits (the roofline's roofs)", "engine.bench",
             ["limits", "--force", "--seconds", "8", "--rounds", "8"],
             ["limits", "--force", "--seconds", "0.5", "--rounds", "2"],
             load_flags=False),
        Step("bandwidth", "decode per weights variant, against the read bandwidth", "engine.bench",
             ["bandwidth", "--dtype", "fp32", "--rounds", "4", "--steps", "4",  # fp32 loaded: every
              "--variants", "bf16,bf16wo+head,int8wo,int8wo+head,int4wo,int4wo+head,int8w8a+head,int4w8a+head8"],  # a downcast
             ["bandwidth", "--rounds", "1", "--steps", "1",
                                                                "--variants", "int8wo"]),
        Step("kv", "KV reuse: a 6-turn chat's last-turn TTFT", "engine.bench", ["kv", "--runs", "3"],
             ["kv", "--runs", "1", "--max-new-tokens", "4", "--last-tokens", "2"]),
        Step("lookup", "prompt lookup: decode with vs without", "engine.bench",
             ["lookup", "--runs", "1", "--prompts", "4", "--max-new-tokens", "96"],
             ["lookup", "--runs", "1", "--prompts", "1", "--max-new-tokens", "8", "--skip-open-ended"]),
        Step("batching", "continuous batching: max batch 1 vs 8", "server.bench",
             ["load", "--compare-max-batch", "1,8", "--levels", "1,8", "--repeat", "1", "--duration", "15",
              "--mix-quantization", "none", "--mix-speculative", "none"],
             ["load", "--compare-max-batch", "1,8", "--levels", "2", "--repeat", "1", "--duration", "1",
              "--conversations", "2", "--max-new-tokens", "4", "--cancel-every", "0", "--mix-quantization", "none",
              "--mix-speculative", "none"]),
    ]
    if peer_python:
        steps.append(Step("peer", "ours vs llama.cpp (and ONNX Runtime GenAI), same token ids", "engine.bench",
                          # ONNX Runtime GenAI joins where $ORT_GENAI_PYTHON and $ORT_GENAI_MODELS name its venv
                          # and exported models (engine/bench/peer_ort.py)
                          ["peer", "--peer-python", peer_python, "--rounds", "2", "--compare-variants",
                           "int4wo+head,int4w8a+head8"],
                          ["peer", "--peer-python", peer_python, "--rounds", "1", "--max-tokens", "8",
                           "--warm-tokens", "2"]))
    if cuda:  # the prepared GPU check (engine/bench/gpu.py): the GPU's limits, decode per variant, its targets
        steps.append(Step("gpu", "the prepared GPU check: limits, variants, graph step, targets", "engine.bench",
                          ["gpu", "--device", "cuda"],
                          ["gpu", "--device", "cuda", "--shapes", "tiny", "--budget-s", "120"]))
    return steps


def add_args(p):
    p.add_argument("--quick", action="store_true", help="every step at its smallest (tests; figures not to quote)")
    p.add_argument("--out", default=None, help="where the dated report folder goes (default: <cache>/reports)")
    p.add_argument("--peer-python", default=os.environ.get("LLAMA_CPP_PYTHON"),
                   help="a venv's python with llama-cpp-python: adds ours vs llama.cpp (default: $LLAMA_CPP_PYTHON)")
    p.add_argument("--only", default="", type=comma_list(), help="run only these steps (comma-separated names)")
    p.add_argument("--note", default="", help="a sentence for the report's header, e.g. 'shared with other jobs'")
    p.add_argument("--readme", nargs="?", const="README.md", default=None, metavar="PATH",
                   help="then rewrite the README's results table from this report (default path: README.md)")
    p.add_argument("--from", dest="from_dir", default=None, metavar="DIR",
                   help="render an existing report folder again (report.md, plots, --readme) without running")
    p.add_argument("--step-timeout", type=float, default=900.0, help="seconds one step may run before it is stopped")


def forwarded(args) -> list[str]:
    """The model flags given to the report, passed on to every step that loads a model."""
    out = []
    for flag, value, unset in (("--model", args.model, None), ("--dtype", args.dtype, "auto"),
                               ("--device", args.device, "auto"), ("--threads", args.threads, None)):
        if value != unset:
            out += [flag, str(value)]
    return out + (["--no-fast-path"] if args.no_fast_path else [])


def default_root() -> Path:
    """Where reports go unless `--out` says otherwise: `reports/` in the engine's cache folder (the page
    shows the newest one from here)."""
    from engine.core.config import LoadConfig
    from engine.model.loader import cache_root

    return cache_root(LoadConfig()) / "reports"


def latest(root: Path) -> Path | None:
    """The newest report folder under `root` (its name starts with its UTC date and time), if any."""
    found = sorted(p for p in Path(root).glob("report-*") if (p / "report.md").is_file()) if Path(root).is_dir() else []
    return found[-1] if found else None


def html_of(folder: Path) -> str:
    """A report folder's report.html; one written before there were any is rendered from its report.json."""
    page = Path(folder) / "report.html"
    return page.read_text() if page.is_file() else render.html_page(render.load(folder))


def run_step(step: Step, argv: list[str], folder: Path, timeout: float, tick) -> dict:
    """Run one step as `python -m ...`, its output to logs/NAME.log; its last JSON line is its result."""
    log_path = folder / "logs" / f"{step.name}.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", *argv], stdout=log, stderr=subprocess.STDOUT, env=env)
        while proc.poll() is None:
            if time.perf_counter() - t0 > timeout:
                proc.kill()
                proc.wait()
                break
            tick(time.perf_counter() - t0)
            time.sleep(0.5)
    lines = log_path.read_text(errors="replace").splitlines()
    result = None
    for line in reversed(lines):
        if line.startswith("{"):
            try:
                result = json.loads(line)
                break
            except ValueError:
                continue
    rc = proc.returncode
    return {"name": step.name, "what": step.what, "command": "python -m " + shlex.join(argv), "rc": rc,
            "seconds": round(time.perf_counter() - t0, 1), "result": result,
            "error": None if rc == 0 and result is not None else "\n".join(lines[-8:]) or f"exit code {rc}",
            "log": str(log_path.relative_to(folder))}


def machine() -> dict:
    """The CPU and GPU by name (lscpu's model, the ISA summary), threads, versions, the load average."""
    import torch

    from engine.platform import capabilities

    caps = capabilities.detect()
    versions = {"python": platform.python_version(), "torch": torch.__version__}
    for pkg in ("transformers", "latency-lab"):
        try:
            from importlib.metadata import version

            versions[pkg] = version(pkg)
        except Exception:  # not installed as a package (a checkout): the commit says which code
            versions[pkg] = None
    here = Path(__file__).resolve().parents[2]
    git = subprocess.run(["git", "-C", str(here), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    versions["commit"] = git.stdout.strip() if git.returncode == 0 else None
    return {"cpu": caps.summary(), "cpu_model": caps.cpu_model, "isa": caps.isa_level, "cores": os.cpu_count(),
            "threads": torch.get_num_threads(), "gpu": caps.cuda_device, "os": platform.platform(),
            "versions": versions}


def run(args, out):
    if args.from_dir:
        folder = Path(args.from_dir)
        report = json.loads((folder / "report.json").read_text())
    else:
        folder, report = measure(args, out)
    md = render.write(folder, report)
    if args.readme:
        render.rewrite_readme(Path(args.readme), report, README_BEGIN, README_END)
        out(f"rewrote the results table in {args.readme}")
    out(md)
    out(f"report: {folder / 'report.md'}; to share: {folder / 'report.html'} (one file, plots inline)")
    return {"report_dir": str(folder), "ok": all(s["rc"] == 0 for s in report["steps"]),
            "ratio": None, "steps": {s["name"]: s["rc"] for s in report["steps"]}}


def measure(args, out) -> tuple[Path, dict]:
    import torch
    from tqdm import tqdm

    started = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0)
    folder = (Path(args.out) if args.out else default_root()) / f"report-{started:%Y-%m-%d_%H%M%SZ}"
    (folder / "logs").mkdir(parents=True, exist_ok=True)
    only = set(args.only)
    steps = [s for s in suite(args.peer_python, torch.cuda.is_available()) if not only or s.name in only]
    report = {"started": started.isoformat().replace("+00:00", "Z"), "quick": args.quick, "note": args.note,
              "machine": machine(), "load_avg_start": _loadavg(), "steps": []}
    forward = forwarded(args)
    bar = tqdm(total=len(steps), unit="step", desc="report", file=sys.stderr, dynamic_ncols=True)
    every = 1.0 if sys.stderr.isatty() else 30.0  # a log file gets a line every 30 s, a terminal a live bar
    t0 = last = time.perf_counter()
    for step in steps:
        bar.set_description(f"{step.name}")

        def tick(s):
            nonlocal last
            if time.perf_counter() - last >= every:
                last = time.perf_counter()
                bar.set_postfix_str(f"{s:.0f} s in this step, {last - t0:.0f} s in all", refresh=True)

        done = run_step(step, step.command(args.quick, forward), folder, args.step_timeout, tick)
        report["steps"].append(done)
        bar.update(1)
        if done["rc"] != 0:
            bar.write(f"{step.name}: failed (exit {done['rc']}); its log: {folder / done['log']}")
        (folder / "report.json").write_text(json.dumps(report, indent=1))  # partial progress stays readable
    bar.close()
    report["seconds"] = round(time.perf_counter() - t0, 1)
    report["load_avg_end"] = _loadavg()
    (folder / "report.json").write_text(json.dumps(report, indent=1))
    return folder, report


def _loadavg():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None
