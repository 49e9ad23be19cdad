"""The one tile scheduler of our CPU kernels (engine/kernels/cpu_tiles.h): every tile runs exactly once, in a
held team or a plain parallel call; each thread takes its own run of tiles from the front, in address order,
and a thread whose run is done takes what is left of another's from the back."""

import pytest
import torch

from engine.kernels import cpu_gemm
from engine.platform import capabilities

CAN_BUILD = (capabilities.detect().torch_cpu_capability in ("AVX2", "AVX512")
             and bool(capabilities.detect().cpp_compiler))
pytestmark = pytest.mark.skipif(not CAN_BUILD, reason="needs AVX2 and a C++ compiler (test_cpu_gemm asserts they build)")


@pytest.fixture
def two_threads():
    cpu_gemm.unavailable_reason()  # built (or loaded) first
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


def census(count, team, slow=(), spin_ms=0):
    times, who = torch.ops.latency_lab_gemv.tiles_census(count, team, list(slow), spin_ms).tolist()
    return times, who


@pytest.mark.parametrize("team", [False, True])
@pytest.mark.parametrize("count", [0, 1, 2, 3, 4, 7, 64, 1000])
def test_every_tile_runs_exactly_once(two_threads, team, count):
    times, who = census(count, team)
    assert times == [1] * count and all(w >= 0 for w in who)


@pytest.mark.parametrize("team", [False, True])
def test_each_run_is_taken_from_its_front_by_its_thread_and_from_its_back_by_the_others(two_threads, team):
    """Two threads, 8 tiles: run [0, 4) is thread 0's, [4, 8) thread 1's, whose tiles spin 25 ms each. In each
    run the tiles its owner ran come first and the ones another thread took last (whatever the timing); and
    thread 0, done with its run in microseconds, takes the last of thread 1's (only a machine that stopped it
    for ~75 ms just then would let thread 1 reach it first)."""
    times, who = census(8, team, slow=range(4, 8), spin_ms=25)
    assert times == [1] * 8
    for owner, run in ((0, who[:4]), (1, who[4:])):
        mine = [w == owner for w in run]
        assert mine == sorted(mine, reverse=True), f"run of thread {owner}: {run}"
    assert who[7] == 0  # thread 0 took the last of thread 1's run
    assert who[:4] == [0] * 4  # so thread 1 took none of thread 0's: it steals only once its own run is gone
