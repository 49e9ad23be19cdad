"""docs/page.md's map of the page is the tree: every file under ui/ is on it (Python, scripts, style,
prompt sets), and nothing on it is missing from the tree, so a newcomer who reads the map finds
each feature's routes, logic and scripts where it says."""

from __future__ import annotations

from pathlib import Path

from test_module_map import map_entries

ROOT = Path(__file__).resolve().parents[1]
PAGE_SUFFIXES = (".py", ".js", ".css", ".json")


def page_files() -> set[str]:
    return {p.relative_to(ROOT).as_posix() for p in (ROOT / "ui").rglob("*")
            if p.suffix in PAGE_SUFFIXES and "__pycache__" not in p.parts and p.name != "__init__.py"}


def test_the_map_reads_js_and_json_too():
    doc = "## Code\n\n```\nui/\n  a.py   x\n  chat/  y\n    b.js, c.css  z\n    d.json  w\n```\n"
    assert map_entries(doc, "## Code", PAGE_SUFFIXES) == {"ui/a.py", "ui/chat/b.js", "ui/chat/c.css", "ui/chat/d.json"}


def test_every_page_file_is_on_the_map_and_the_map_is_the_tree():
    on_map = {p for p in map_entries((ROOT / "docs" / "page.md").read_text(), "## Code", PAGE_SUFFIXES)
              if p.startswith("ui/")}
    files = page_files()
    assert sorted(files - on_map) == [], "files missing from docs/page.md's map"
    assert sorted(on_map - files) == [], "docs/page.md's map names files that are not in ui/"

