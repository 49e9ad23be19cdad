"""The Pareto view of sweeps, one per max batch: each level a point, total output tokens/s (x)
against output tokens/s per user (y, the median over requests of 1000 / TPOT: how fast one reply
reads once it has started), and one sentence stating the trade-off in the measured numbers."""

from __future__ import annotations


def points(sweep: dict) -> list[dict]:
    """One sweep's levels as Pareto points (levels that completed nothing are left out)."""
    return [{"request_rate": r["request_rate"], "output_throughput": r["output_throughput"],
             "output_throughput_per_user": r["output_throughput_per_user"], "request_goodput": r["request_goodput"]}
            for r in sweep["levels"] if r["output_throughput"] and r["output_throughput_per_user"]]


def frontier(pts: list[dict]) -> list[dict]:
    """The points no other point beats on both axes, by total tokens/s."""
    keep = [p for p in pts if not any(q is not p and q["output_throughput"] >= p["output_throughput"]
                                      and q["output_throughput_per_user"] >= p["output_throughput_per_user"]
                                      and (q["output_throughput"], q["output_throughput_per_user"])
                                      != (p["output_throughput"], p["output_throughput_per_user"]) for q in pts)]
    return sorted(keep, key=lambda p: p["output_throughput"])


def sentence(by_batch: dict) -> str | None:
    """The trade-off between the smallest and the largest max batch: each one's best total tokens/s and
    the per-user speed it came with, and the goodput each sustained."""
    if len(by_batch) < 2:
        return None
    small, large = min(by_batch), max(by_batch)

    def best(mb):
        pts = points(by_batch[mb])
        return max(pts, key=lambda p: p["output_throughput"]) if pts else None

    a, b = best(small), best(large)
    if a is None or b is None:
        return None
    ga, gb = by_batch[small]["max_request_goodput"], by_batch[large]["max_request_goodput"]
    goodput = ""
    if ga is not None and gb is not None:
        ratio = f" ({gb / ga:.1f}×)" if ga else ""
        goodput = f"; within the objectives it sustained {gb:.2f} req/s against {ga:.2f}{ratio}"
    return (f"Max batch {large} reached {b['output_throughput']:.1f} output tok/s in total at "
            f"{b['output_throughput_per_user']:.1f} tok/s per user, against {a['output_throughput']:.1f} tok/s at "
            f"{a['output_throughput_per_user']:.1f} tok/s per user for max batch {small}: "
            f"{b['output_throughput'] / a['output_throughput']:.1f}× the total for "
            f"{b['output_throughput_per_user'] / a['output_throughput_per_user']:.2f}× the speed each user reads"
            f"{goodput}.")
