"""docs/engine.md's module map is the tree: every module under engine/ is on it, and nothing on it
is missing from the tree (so a newcomer who reads the map finds each file where it says)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE_SUFFIXES = (".py", ".cpp")


def map_entries(doc: str, heading: str = "## Modules", suffixes: tuple[str, ...] = SOURCE_SUFFIXES) -> set[str]:
    """Paths named by the first code block after `heading`: a tree in which a line whose first
    word ends in '/' opens a folder and deeper-indented lines are inside it (tests/test_page_map.py
    reads the page's map with it too)."""
    section = doc.split(heading, 1)[1]
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
        if not re.fullmatch(r"[\w.]+(/|(%s),?)" % "|".join(map(re.escape, suffixes)), word):
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


# --- the layers: each folder imports only the ones below it ------------------------------------------
def layer_order(doc: str) -> list[str]:
    """The order written in docs/engine.md's '## Layers' block: 'core < platform < ...'."""
    section = doc.split("## Layers", 1)[1]
    block = re.search(r"```\n(.*?)```", section, re.S).group(1)
    return [name.strip() for name in block.strip().split("<")]


def layer_of(module: str) -> str | None:
    """'engine.runtime.plan' -> 'runtime'; 'engine.lab' -> 'lab'; 'engine.__main__' -> 'cli'; the
    package itself ('engine', its facade of re-exports) -> None."""
    parts = module.split(".")
    if len(parts) < 2:
        return None
    return "cli" if parts[1] == "__main__" else parts[1]


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _exists(module: str) -> bool:
    base = ROOT.joinpath(*module.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def imported_modules(source: str, module: str, is_package: bool) -> set[str]:
    """The engine modules `source` imports, at the top or inside functions (the longest existing prefix
    of each name: `from engine.kernels import cpu_gemm` is engine.kernels.cpu_gemm)."""
    import ast

    package = module if is_package else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            names = [f"{base}.{a.name}" for a in node.names]
        for name in names:
            if not name.startswith("engine"):
                continue
            while "." in name and not _exists(name):
                name = name.rsplit(".", 1)[0]
            found.add(name)
    return found


def upward_imports(order: list[str], sources: dict[str, tuple[str, bool]]) -> list[str]:
    """'source -> target' for each import whose target's layer stands above the source's."""
    rank = {name: i for i, name in enumerate(order)}
    bad = []
    for module, (source, is_package) in sources.items():
        own = layer_of(module)
        for target in imported_modules(source, module, is_package):
            theirs = layer_of(target)
            if own is None or theirs is None or theirs == own:
                continue
            if rank[theirs] > rank[own]:
                bad.append(f"{module} ({own}) -> {target} ({theirs})")
    return sorted(bad)


def engine_sources() -> dict[str, tuple[str, bool]]:
    return {_module_name(p): (p.read_text(), p.name == "__init__.py")
            for p in (ROOT / "engine").rglob("*.py") if "__pycache__" not in p.parts}


def test_the_layer_check_catches_an_import_that_points_up():
    order = ["core", "runtime", "serving"]
    sources = {"engine.core.timeline": ("def f():\n    from engine.serving import worker\n", False),
               "engine.serving.worker": ("from engine.core.timeline import Timeline\nimport engine.runtime.plan\n", False),
               "engine.runtime.plan": ("from ..core import timeline\n", False)}
    assert upward_imports(order, sources) == ["engine.core.timeline (core) -> engine.serving.worker (serving)"]


def test_every_folder_imports_only_the_layers_below_it():
    order = layer_order((ROOT / "docs" / "engine.md").read_text())
    sources = engine_sources()
    layers = {layer_of(m) for m in sources} - {None}
    assert sorted(layers - set(order)) == [], "folders missing from docs/engine.md's layer order"
    assert sorted(set(order) - layers) == [], "the layer order names folders that are not in engine/"
    assert upward_imports(order, sources) == []
