"""docs/engine.md's module map is the tree: every module under engine/ is on it, and nothing on it
is missing from the tree (so a newcomer who reads the map finds each file where it says)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE_SUFFIXES = (".py", ".cpp")


def map_entries(doc: str) -> set[str]:
    """Paths named by the first code block after '## Modules': a tree in which a line whose first
    word ends in '/' opens a folder and deeper-indented lines are inside it."""
    section = doc.split("## Modules", 1)[1]
    block = re.search(r"```\n(.*?)```", section, re.S).group(1)
    stack: list[tuple[int, str]] = []  # (indent, folder)
    paths = set()
    for line in block.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        words = line.split()
        names = [words[0]]
        while names[-1].endswith(",") and len(names) < len(words):  # "a.py, b.py  what they are"
            names.append(words[len(names)])
        word = words[0]
        if not re.fullmatch(r"[\w.]+(/|\.py,?|\.cpp,?)", word):
            continue  # a description's continuation line
        while stack and stack[-1][0] >= indent:
            stack.pop()
        prefix = "".join(folder for _, folder in stack)
        if word.endswith("/"):
            stack.append((indent, word))
        else:
            paths.update(prefix + name.rstrip(",") for name in names)
    return paths


def tree_modules() -> set[str]:
    found = set()
    for path in (ROOT / "engine").rglob("*"):
        if path.suffix in SOURCE_SUFFIXES and "__pycache__" not in path.parts and path.name != "__init__.py":
            found.add(path.relative_to(ROOT).as_posix())
    return found


def test_map_parser_reads_a_tree():
    doc = ("## Modules\n\n```\nengine/\n  a.py   x\n  core/  y\n    b.py, c.cpp  z, w\n"
           "                 more words about c\n  d.py\n```\n")
    assert map_entries(doc) == {"engine/a.py", "engine/core/b.py", "engine/core/c.cpp", "engine/d.py"}


def test_every_engine_module_is_on_the_map_and_the_map_is_the_tree():
    on_map = map_entries((ROOT / "docs" / "engine.md").read_text())
    modules = tree_modules()
    assert sorted(modules - on_map) == [], "modules missing from docs/engine.md's map"
    assert sorted(on_map - modules) == [], "docs/engine.md's map names files that are not in engine/"
