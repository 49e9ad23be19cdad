"""One build of our extension at a time, and no start that waits forever on a build that died.

torch's `cpp_extension.load` guards a build folder with a file, `lock`, created when a build starts
and removed when it ends; a process that finds it waits until it goes. A build killed midway (a
`make run` stopped with Ctrl-C while it compiles, a test run cut short) leaves the file behind, and
every later start then sleeps in that wait forever, with nothing on screen. The file names no owner,
so torch cannot tell a stale lock from a live build.

Here each build also holds an OS lock (`flock`) on a file of ours beside it, `latency_lab.owner`,
which the kernel releases when its process ends, however it ends. Holding it proves no process of
ours is building in that folder, so a `lock` still there was left by a build that died: we say so
and remove it. Finding it held means a live build: we say whose and wait for it, then load what it
built. (`flock`, not a library: it is the one primitive whose release survives SIGKILL, in the
standard library.)

A build that compiles takes minutes on 2 cores, where loading a built one takes well under a second:
past SLOW_S a line says it is compiling, so a first start does not look stuck.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

OWNER = "latency_lab.owner"  # our OS-locked file; it holds the building process's pid
TORCH_LOCK = "lock"  # torch.utils.file_baton's file in the build folder (cpp_extension._jit_compile)
SLOW_S = 5.0  # a load still running after this is compiling (a built library loads in well under it)
log = logging.getLogger(__name__)


@contextlib.contextmanager
def exclusive_build(build_dir: str | os.PathLike, slow_s: float = SLOW_S) -> Iterator[None]:
    """Hold the build folder for one `cpp_extension.load`: wait for a live build of another process,
    clear a lock left by a dead one, say so if the load takes past `slow_s` (it is compiling). Where
    `fcntl` is missing (not a POSIX system), only the last."""
    try:
        import fcntl
    except ImportError:  # no flock here: torch's own lock is all there is
        with _notice_if_slow(build_dir, slow_s):
            yield
        return
    folder = Path(build_dir)
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / OWNER, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            log.warning("waiting for another process (pid %s) that is building the kernels in %s", owner, folder)
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        stale = folder / TORCH_LOCK
        if stale.exists():
            log.warning("removing %s: a kernel build there was interrupted (no process is building now); "
                        "building again", stale)
            stale.unlink(missing_ok=True)
        with _notice_if_slow(folder, slow_s):
            yield
    finally:
        os.close(fd)  # closing the descriptor releases the flock


@contextlib.contextmanager
def _notice_if_slow(folder: str | os.PathLike, slow_s: float) -> Iterator[None]:
    timer = threading.Timer(slow_s, log.warning, ("compiling our C++ kernels into %s: once after each change to "
                                                  "them, a few minutes on 2 cores", folder))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
