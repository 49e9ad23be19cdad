"""The limits probe's probes (engine/measure/machine_limits.py `measure` runs them in interleaved rounds):
read and copy bandwidth over buffers far past the last-level cache, and the matmul peak per dtype. Each
`round(budget_s)` returns one rate, the best repeat within its budget; every repeat lies between two of the
one clock's done-stamps (engine/core/clock.py: on CUDA after `torch.cuda.synchronize()`). Apart from the
limits' bookkeeping (caching, staleness, notes) so that each file stays one concern."""

from __future__ import annotations

import torch

from engine.core import clock


def _best_of(fn, device: torch.device, budget_s: float, min_reps: int = 2, inner: int = 1) -> tuple[float, int]:
    """The shortest time of `fn()` over repeats filling `budget_s` (after one warm-up); each repeat
    times `inner` calls between two synchronizations (a GPU's launch cost spread over them)."""
    fn()
    clock.sync(device)
    best, reps, end = float("inf"), 0, clock.now_ns() + budget_s * 1e9
    while reps < min_reps or clock.now_ns() < end:
        t = clock.done_ns(device)
        for _ in range(inner):
            fn()
        best = min(best, (clock.done_ns(device) - t) / 1e9 / inner)
        reps += 1
        if reps >= 200:
            break
    return best, reps


def _inner(device: torch.device) -> int:
    """Calls per timed repeat: 10 on CUDA (a 1 GiB read takes well under a millisecond there), 1 on CPU."""
    return 10 if device.type == "cuda" else 1


class ReadProbe:
    """GB/s of the faster of `torch.sum(buf)` and, on CPU where our kernels are built (whatever their switch),
    our fp32 one-row product over the buffer seen as panels (cpu_gemm.fp32_mm, an fp32 decode step's reader):
    torch.sum alone read below the fp32 steps of an Intel Xeon (docs/roofline.md, "Why two readers")."""

    K = 2048  # the buffer as panels [rows, K, 16] (a MiB holds 8 such panels)

    def __init__(self, device: torch.device, mib: int):
        self.device = device
        self.buf = torch.ones(mib * 2**20 // 4, dtype=torch.float32, device=device)
        self.readers = {"torch.sum(buf)": lambda: torch.sum(self.buf)}
        if device.type == "cpu":
            from engine.kernels import cpu_gemm

            if cpu_gemm.built_reason() is None:
                panels, x = self.buf.view(-1, self.K, cpu_gemm.PANEL), torch.ones(1, self.K)
                n = panels.shape[0] * cpu_gemm.PANEL
                self.readers["fp32_mm(buf as panels)"] = lambda: cpu_gemm.fp32_mm(x, panels, n)
        self.best = {name: 0.0 for name in self.readers}  # each reader's best GB/s over the rounds
        self.info = {"buffer_mib": mib, "op": " | ".join(self.readers), "readers_gbps": self.best}

    def round(self, budget_s: float) -> float:  # this round's faster reader (each one's best kept in `info`)
        rates = {}
        for name, fn in self.readers.items():
            best, _ = _best_of(fn, self.device, budget_s / len(self.readers), inner=_inner(self.device))
            rates[name] = self.buf.numel() * 4 / best / 1e9
            self.best[name] = round(max(self.best[name], rates[name]), 2)
        return max(rates.values())


class CopyProbe:
    """GB/s of `dst.copy_(src)`: bytes read + written per second."""

    def __init__(self, device: torch.device, mib: int):
        self.device = device
        self.src = torch.ones(mib * 2**20 // 4, dtype=torch.float32, device=device)
        self.dst = torch.empty_like(self.src)
        self.info = {"buffer_mib": mib, "op": "dst.copy_(src)"}

    def round(self, budget_s: float) -> float:
        best, _ = _best_of(lambda: self.dst.copy_(self.src), self.device, budget_s, inner=_inner(self.device))
        return 2 * self.src.numel() * 4 / best / 1e9


class MatmulProbe:
    """TFLOP/s of `torch.mm` on square matrices of `dtype` (2·N³ FLOP per product); N doubled from
    256 until one product takes ≥ 20 ms (after a warm-up product of that size)."""

    def __init__(self, device: torch.device, dtype: torch.dtype, max_n: int | None = None):
        self.device = device
        max_n = max_n or (8192 if device.type == "cuda" else 2048)
        self.mm = torch._int_mm if dtype == torch.int8 else torch.mm  # int8: int32 products, CPU and CUDA
        n = 256
        while True:
            self.a, self.b = (torch.randint(-127, 128, (n, n), device=device, dtype=dtype) if dtype == torch.int8
                              else torch.randn(n, n, device=device).to(dtype) for _ in range(2))
            self.mm(self.a, self.b)  # warm-up: the first product of a size pays for thread start and packing
            t = clock.done_ns(device)
            self.mm(self.a, self.b)
            if clock.done_ns(device) - t >= 0.02e9 or n >= max_n:
                break
            n *= 2
        self.n = n
        self.info = {"n": n, "op": f"torch.{self.mm.__name__} {n}x{n} {dtype}"}

    def round(self, budget_s: float) -> float:
        best, _ = _best_of(lambda: self.mm(self.a, self.b), self.device, budget_s)
        return 2 * self.n**3 / best / 1e12
