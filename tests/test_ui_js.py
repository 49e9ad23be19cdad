"""The page's pure ES modules, tested in Node's test runner (tests/js/*.test.js): the smoothing schedule,
markdown, the clock offset and SSE frames, the overlays' layout, the Load tab's statistics. Node: the
one on PATH, else the Node that the playwright package ships with its driver."""

import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def node() -> str:
    found = shutil.which("node")
    if found:
        return found
    import playwright

    bundled = Path(playwright.__file__).parent / "driver" / "node"
    assert bundled.exists(), "no Node.js: install nodejs, or the playwright package (it ships one)"
    return str(bundled)


def test_the_pure_modules_in_node():
    files = sorted(str(p) for p in (ROOT / "tests" / "js").glob("*.test.js"))
    assert files, "no JavaScript tests found"
    run = subprocess.run([node(), "--test", "--test-reporter=tap", *files], cwd=ROOT, capture_output=True, text=True, timeout=300)
    out = run.stdout + run.stderr
    passed = re.search(r"^# pass (\d+)", out, re.M)
    assert run.returncode == 0 and passed and int(passed.group(1)) >= 25, out[-6000:]
