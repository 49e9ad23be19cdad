"""Every file path that a comment, docstring or doc names under engine/, server/, ui/, tests/ or
scripts/ exists, and every class named by its dotted module path (`engine.core.timeline.Timeline`)
is defined there: a module that moved takes its mentions with it."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAMED = re.compile(r"(?<![\w/.-])((?:engine|server|ui|tests|scripts)/[\w./-]*?\.(?:json|py|js|cpp|inc|h|md|sh))(?![\w/])")
DOTTED = re.compile(r"(?<![\w.])((?:engine|server|ui)(?:\.[a-z_0-9]+)+)\.([A-Z]\w*)")  # module.Class
EXAMPLES = {"tests/test_module_map.py", "tests/test_page_map.py", "tests/test_doc_paths.py"}  # paths made up to test the checks themselves


def tracked_texts():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for name in tracked:
        if not name.endswith((".py", ".md", ".js", ".cpp", ".h", ".inc", ".toml", ".ini", ".sh")) or name in EXAMPLES:
            continue
        path = ROOT / name
        if path.is_file():
            yield name, path.read_text(encoding="utf-8", errors="replace").splitlines()


def named_paths() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for name, lines in tracked_texts():
        for i, line in enumerate(lines, 1):
            for m in NAMED.finditer(line):
                found.setdefault(m[1], []).append(f"{name}:{i}")
    return found


def test_the_pattern_finds_a_path_and_not_a_longer_name():
    assert NAMED.findall("see engine/core/timeline.py, and ui/x.json's keys; not myengine/a.py") == [
        "engine/core/timeline.py", "ui/x.json"]


def test_every_named_path_exists():
    found = named_paths()
    assert "engine/core/counters.py" in found  # the scan reads what it should
    missing = {p: where[:3] for p, where in found.items() if not (ROOT / p).exists()}
    assert not missing, missing


def defines(module: str, name: str) -> bool:
    path = ROOT.joinpath(*module.split("."))
    source = path.with_suffix(".py") if path.with_suffix(".py").is_file() else path / "__init__.py"
    if not source.is_file():
        return False
    return re.search(rf"^\s*(class|def) {name}\b|^{name}\s*[:=]", source.read_text(encoding="utf-8"), re.M) is not None


def test_every_dotted_class_is_defined_in_the_module_named():
    assert DOTTED.findall("(`engine.core.timeline.Timeline`), not engine.info().x") == [("engine.core.timeline", "Timeline")]
    wrong = [f"{name}:{i}: {m[0]}" for name, lines in tracked_texts() for i, line in enumerate(lines, 1)
             for m in DOTTED.finditer(line) if not defines(m[1], m[2])]
    assert not wrong, wrong
