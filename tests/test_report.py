"""`latency-lab report` (engine/bench/report.py): the suite with --quick on a tiny model (each bench in its own
process, one dated folder), its rendering from a report.json (table, README markers, plots) and the entry point."""

import html
import json
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

import pytest

from engine.bench import report, report_render

REPORT = {
    "started": "2026-12-03T17:00:00Z", "quick": False, "note": "Shared with other jobs.", "seconds": 512.3,
    "machine": {"cpu": "AMD EPYC (family 25 model 17) · AVX-512 BF16", "cores": 2, "threads": 2, "gpu": None,
                "os": "Linux", "versions": {"python": "3.11", "torch": "2.13.0", "transformers": "5.24.0",
                                            "commit": "abc1234"}},
    "load_avg_start": [3.1, 2.0, 1.5], "load_avg_end": [4.0, 3.0, 2.0],
    "steps": [
        {"name": "limits", "what": "the machine's limits", "command": "python -m engine.bench limits "
         "--force --json", "rc": 0, "seconds": 9.0, "log": "logs/limits.log", "error": None,
         "result": {"key": {}, "measured_at": "2026-12-03T17:00:05Z", "read_gbps": 30.0, "copy_gbps": 20.0,
                    "matmul_tflops": {"fp32": 0.2}, "details": {"read": {"best": 30.0, "median": 28.0, "worst": 20.0,
                                                                          "spread": 0.33, "rounds_n": 8}}}},
        {"name": "bandwidth", "what": "decode per weights variant", "command": "python -m engine.bench bandwidth "
         "--json", "rc": 0, "seconds": 90.0, "log": "logs/bandwidth.log", "error": None,
         "result": {"read_gbps": 30.0, "context": 256, "refused": {},
                    "variants": {"fp32": {"tok_s": 40.0, "fraction_of_read": 0.61},
                                 "int8wo": {"tok_s": 70.0, "fraction_of_read": 0.45}}}},
        {"name": "kv", "what": "KV reuse", "command": "python -m engine.bench kv --json", "rc": 1, "seconds": 3.0,
         "log": "logs/kv.log", "result": None, "error": "Traceback...\nRuntimeError: out of memory"},
    ],
}


def test_the_table_names_each_step_its_figures_and_its_command_and_a_failure_says_why():
    table = report_render.table(REPORT)
    lines = table.splitlines()
    assert len(lines) == 2 + 3
    assert "read 30.0 GB/s · copy 20.0 GB/s" in lines[2] and "`python -m engine.bench limits --force`" in lines[2]
    assert "fp32 40.0 tok/s (61%), int8wo 70.0 tok/s (45%)" in lines[3] and "30.0 GB/s read" in lines[3]
    assert "failed (exit 1): RuntimeError: out of memory" in lines[4]
    head = report_render.header(REPORT)
    assert "2026-12-03 17:00:00 UTC" in head and "AMD EPYC (family 25 model 17)" in head and "2 threads" in head
    assert "load average 3.1" in head and "torch 2.13.0" in head and "Shared with other jobs." in head


def test_readme_table_is_rewritten_between_its_markers_only(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\nbefore\n{report.README_BEGIN}\nold table\n{report.README_END}\nafter\n")
    report_render.rewrite_readme(readme, REPORT, report.README_BEGIN, report.README_END)
    text = readme.read_text()
    assert "old table" not in text and text.startswith("# Title\n\nbefore\n") and text.endswith("after\n")
    assert report_render.table(REPORT) in text and report_render.header(REPORT) in text
    report_render.rewrite_readme(readme, REPORT, report.README_BEGIN, report.README_END)
    assert readme.read_text() == text  # idempotent
    readme.write_text("no markers")
    with pytest.raises(ValueError, match="markers"):
        report_render.rewrite_readme(readme, REPORT, report.README_BEGIN, report.README_END)


def test_plots_are_svg_and_the_newest_report_is_found(tmp_path):
    for stamp in ("2026-12-01_100000Z", "2026-12-03_170000Z"):
        folder = tmp_path / f"report-{stamp}"
        folder.mkdir()
        report_render.write(folder, REPORT)
    assert report.latest(tmp_path).name == "report-2026-12-03_170000Z"
    assert report.latest(tmp_path / "none") is None
    plots = sorted(p.name for p in (tmp_path / "report-2026-12-03_170000Z" / "plots").iterdir())
    assert plots == ["bandwidth.svg", "limits.svg"]
    svg = ET.parse(tmp_path / "report-2026-12-03_170000Z" / "plots" / "bandwidth.svg").getroot()
    assert svg.tag.endswith("svg") and "61% of read bandwidth" in ET.tostring(svg, encoding="unicode")
    md = (tmp_path / "report-2026-12-03_170000Z" / "report.md").read_text()
    assert "![bandwidth.svg](plots/bandwidth.svg)" in md and "logs/kv.log" in md


def test_latency_lab_report_goes_to_the_bench_and_latency_lab_alone_still_serves(monkeypatch):
    import app
    import engine.bench

    seen = []
    monkeypatch.setattr(engine.bench, "main", lambda argv: seen.append(argv) or 0)
    assert app.main(["report", "--quick"]) == 0 and seen == [["report", "--quick"]]
    assert app.build_parser().parse_args([]).port  # no subcommand: the page's flags, as before


def test_report_quick_runs_the_suite_and_writes_one_dated_folder(tmp_path, tokenizer, monkeypatch):
    """Every step on a tiny model (a 4,096-token window: the KV bench's chat is ~500 tokens), each in its own
    process; the bandwidth bench divides by the read bandwidth the limits step just cached (the one probe)."""
    from conftest import build_tiny_model_dir

    from engine.bench import main

    model = build_tiny_model_dir(tmp_path / "tiny", tokenizer, max_position_embeddings=4096)
    monkeypatch.setenv("LATENCY_LAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("LLAMA_CPP_PYTHON", raising=False)
    readme = tmp_path / "README.md"
    readme.write_text(f"x\n{report.README_BEGIN}\n{report.README_END}\n")
    code = main(["report", "--quick", "--model", str(model), "--dtype", "fp32", "--out", str(tmp_path / "r"),
                 "--readme", str(readme), "--note", "a test"])
    folder = report.latest(tmp_path / "r")
    data = json.loads((folder / "report.json").read_text())
    failed = {s["name"]: s["error"] for s in data["steps"] if s["rc"] != 0}
    assert code == 0 and not failed, failed
    assert [s["name"] for s in data["steps"]] == ["limits", "bandwidth", "kv", "lookup", "batching"]
    steps = {s["name"]: s for s in data["steps"]}
    assert all(s["command"].startswith("python -m ") and (folder / s["log"]).is_file() for s in data["steps"])
    assert steps["bandwidth"]["result"]["read_gbps"] == steps["limits"]["result"]["read_gbps"]
    assert steps["kv"]["result"]["identical"] and steps["batching"]["result"]["ok"]
    assert folder.name.startswith(f"report-{data['started'][:10]}")
    assert (folder / "plots" / "batching.svg").is_file() and (folder / "report.md").is_file()
    assert (folder / "report.html").read_text().count("<svg") == len(report_render.plots(data))
    assert report_render.table(data) in readme.read_text() and "`--quick`" in readme.read_text()


def test_the_page_serves_the_newest_report_and_says_how_to_make_one(tmp_path, monkeypatch):
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from ui.chat.paced import PacedSource
    from ui.chat.store import ChatStore
    from ui.shell.header import header_router

    monkeypatch.setenv("LATENCY_LAB_CACHE", str(tmp_path))
    source = PacedSource(tokens_per_s=1000, prefill_ms=1)
    app = FastAPI()
    app.include_router(header_router(ChatStore(source)))  # the header's report link
    try:
        with TestClient(app) as c:
            none = c.get("/lab/report")
            assert none.status_code == 404 and "latency-lab report" in none.text
            folder = tmp_path / "reports" / "report-2026-12-03_170000Z"
            folder.mkdir(parents=True)
            report_render.write(folder, REPORT)
            got = c.get("/lab/report")
            assert got.status_code == 200 and report_render.table(REPORT) in got.text
            page = c.get("/lab/report.html")  # the header's link: the one file to share
            assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
            assert page.text == (folder / "report.html").read_text() and page.text.count("<svg") == 2
            (folder / "report.json").write_text(json.dumps(REPORT))
            (folder / "report.html").unlink()  # a report made before report.html existed: rendered from its JSON
            assert c.get("/lab/report.html").text == page.text
    finally:
        source.close()


class Resources(HTMLParser):
    """Everything an HTML page could fetch: tags that load, and attributes naming another resource."""

    def __init__(self):
        super().__init__()
        self.fetches, self.tags = [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        for name, value in attrs:
            if name in ("src", "href", "srcset", "data", "poster", "action", "xlink:href") and value:
                self.fetches.append((tag, name, value))
        if tag in ("script", "link", "iframe", "img", "object", "embed"):
            self.fetches.append((tag, "tag", ""))


def test_report_html_is_one_self_contained_file(tmp_path):
    report_render.write(tmp_path, REPORT)
    text = (tmp_path / "report.html").read_text()
    found = Resources()
    found.feed(text)
    assert found.fetches == [] and "url(" not in text and "@import" not in text
    assert found.tags.count("svg") == len(report_render.plots(REPORT)) == 2  # the plots, inline
    for s in REPORT["steps"]:  # every step's line and command, as in report.md
        assert html.escape(s["command"].replace(" --json", ""), quote=False) in text
    assert "<strong>" not in text or "**" not in text  # the table's bold marks are HTML, not Markdown
    assert "failed (exit 1): RuntimeError: out of memory" in text and "Shared with other jobs." in text


def test_the_suite_passes_the_model_flags_on_and_adds_the_gpu_and_peer_steps_where_they_exist():
    """No GPU here: the CUDA steps are checked as commands (they run where torch sees a GPU)."""
    steps = {s.name: s for s in report.suite("/opt/llama/bin/python", cuda=True)}
    assert list(steps) == ["limits", "bandwidth", "kv", "lookup", "batching", "peer", "gpu"]
    forward = ["--model", "m", "--device", "cpu"]
    assert steps["limits"].command(False, forward)[-1] == "--json" and "--model" not in steps["limits"].command(False, forward)
    gpu = steps["gpu"].command(True, forward)  # the prepared GPU check (engine/bench/gpu.py)
    assert gpu[:4] == ["engine.bench", "gpu", "--device", "cuda"] and gpu.count("--device") == 1 and "m" in gpu
    assert steps["gpu"].command(False, forward)[-1] == "--json"
    assert "--peer-python" in steps["peer"].command(False, forward)
    assert [s.name for s in report.suite(None, cuda=False)] == ["limits", "bandwidth", "kv", "lookup", "batching"]


def test_bench_peer_runs_llama_cpp_again_without_its_extra_buffers_where_its_amx_path_dies(tmp_path):
    """llama-cpp-python's AMX path died with SIGILL on an AMX Xeon (engine/bench/peer.py `peer`): the bench
    runs it again without its extra buffer types, remembers that for the later rounds, and says so."""
    import json
    from types import SimpleNamespace

    from engine.bench import peer

    fake = tmp_path / "python"  # a stand-in interpreter: dies by SIGILL unless the job turns the extras off
    log = tmp_path / "jobs"
    fake.write_text(f"""#!/bin/sh
job=$(cat)
echo "$job" >> {log}
case "$job" in *'"extra_bufts": false'*) echo '{{"version": "fake", "extra_bufts": false}}' ;; *) kill -ILL $$ ;; esac
""")
    fake.chmod(0o755)
    job = {"gguf": "x", "threads": 2}
    args = SimpleNamespace(peer_python=str(fake))
    assert peer.peer(args, job) == {"version": "fake", "extra_bufts": False}
    assert peer.peer(args, job)["extra_bufts"] is False  # the next round goes straight to the fallback
    assert [json.loads(line).get("extra_bufts", True) for line in log.read_text().splitlines()] == [True, False, False]


def test_a_bandwidth_share_above_the_limit_is_said_never_printed():
    """A step from the last-level cache reads faster than memory (its share would read 134%), and a step above a
    stale limit has no share: the table and the plot say which, as `bench bandwidth` does."""
    rows = {"fp32": {"tok_s": 56.5, "fraction_of_read": 0.85},
            "int4w8a+head8": {"tok_s": 458.7, "fraction_of_read": 1.34, "from_cache": True},
            "int8w8a+head": {"tok_s": 262.9, "fraction_of_read": None, "limit_stale": True},
            "int8wo": {"tok_s": 90.0, "fraction_of_read": 1.2}}  # an older report.json without the flags
    line = report_render.bandwidth_line({"read_gbps": 36.7, "context": 256, "variants": rows})
    assert "fp32 56.5 tok/s (85%)" in line and "134%" not in line and "120%" not in line
    assert "int4w8a+head8 458.7 tok/s (from the last-level cache)" in line
    assert "int8w8a+head 262.9 tok/s (above the measured limit: limit stale)" in line
    assert "int8wo 90.0 tok/s (above the measured limit: limit stale)" in line
    svg = report_render.plots({"steps": [{"name": "bandwidth", "result": {"variants": rows}}]})
    text = next(iter(svg.values()))
    assert "85% of read bandwidth" in text and "134%" not in text and "from the last-level cache" in text
