"""docs/page.md's map of the page is the tree: every file under ui/ is on it (Python, scripts, style,
prompt sets), and nothing on it is missing from the tree, so a newcomer who reads the map finds
each feature's routes, logic and scripts where it says. The page's files stay small, and only the
entry module touches the page's one global, window.lab."""

from __future__ import annotations

from pathlib import Path

from test_module_map import map_entries

ROOT = Path(__file__).resolve().parents[1]
PAGE_SUFFIXES = (".py", ".js", ".css", ".json")
MAX_LINES = 400


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


def test_no_page_file_is_over_400_lines():
    long = {f: n for f in sorted(page_files()) if (n := len((ROOT / f).read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"split these (at most {MAX_LINES} lines a file): {long}"


def test_only_the_entry_module_touches_window_lab():
    """`grep -c window.lab` over the scripts: the entry module's lines only."""
    touching = {f for f in page_files() if f.endswith(".js") and "window.lab" in (ROOT / f).read_text()}
    assert touching == {"ui/entry.js"}
