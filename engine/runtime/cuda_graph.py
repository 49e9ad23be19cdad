"""The static decode step: one token for each of B sequences over fixed buffers, which a CUDA graph
captures and replays (the `compiled_decode` toggle on a GPU, as gpt-fast and vLLM do it).

Why: on a GPU a decode step of a small model is launch-bound — the eager forward issues a few dozen
kernels a layer from Python, each taking longer to launch than to run — and a CUDA graph replays the
whole step's kernels in one launch. A graph fixes every address and shape it captured, so the step it
captures must read and write only fixed buffers and never ask the host anything:
- the KV of the sequences it steps lives in a **pool** per capacity bucket C (a power of two):
  keys and values shaped [layers, ROWS, kv_heads, C, head_dim]. A sequence's `KVCache` *borrows* a row:
  its k and v become views of that row ([layers, 1, kv_heads, C, head_dim], the KVCache layout), so the
  eager forward, speculation, KV reuse and chunked prefill keep working on it unchanged. A row is
  taken back (its KV copied out to the cache's own buffer) only when another sequence needs it;
- token ids and positions are tensors (`ids`, `pos`), filled before each replay; the new key and value
  are written at `pos`, and attention reads all C positions with a mask (position <= pos), so nothing
  depends on a host-side length;
- the step for b sequences uses rows [0, b) of a pool; B sequences are padded to the next captured size
  (SIZES) with rows that write at position C - 1. That position is never valid KV: a sequence steps in
  a pool only while its position is below C - 1 (`fits`), so a padding row writes scratch.

The step is `blocks` (engine/runtime/blocks.py), the eager forward's own layer loop, with a static
`attend`; projections run the kernel the plan (engine/runtime/plan.py) names for one row. The uncaptured step is
the same function run directly: every CUDA decode step of B <= ROWS one-token sequences goes through
it (one batched attention a layer instead of one per sequence), and the toggle replays it from a graph.
On CPU it runs uncaptured (tests check it against the eager forward); graphs are CUDA only.

Capture: per (rows, bucket), on first use; a compiled request captures its bucket's sizes in its setup
(the `capture` span). A capture that fails is remembered with its reason and the step runs uncaptured.
"""

from __future__ import annotations

import threading
import weakref

import torch
import torch.nn.functional as F

from engine.core import clock
from engine.core.errors import first_line
from engine.runtime.blocks import Projections, blocks

SIZES = (1, 2, 4, 8)  # captured batch sizes; B sequences use the smallest size >= B (vLLM pads the same way)
ROWS = SIZES[-1]  # rows of a pool: a batch of more one-token sequences takes the eager forward
MIN_BUCKET = 256  # the smallest pool capacity: short chats share one bucket, so one set of graphs


def bucket(positions: int, max_context: int) -> int | None:
    """The pool capacity for a sequence that will hold `positions` positions (its scratch position
    included): a power of two, at least MIN_BUCKET, at most the context window (None: it does not fit)."""
    if positions > max_context:
        return None
    c = MIN_BUCKET
    while c < positions:
        c *= 2
    return min(c, max_context)


def fits(cache, capacity: int) -> bool:
    """Whether `cache` can take its next one-token step in a pool of `capacity`: its new position stays
    below the scratch position capacity - 1."""
    return cache.length + 1 < capacity


class Pool:
    """The borrowed KV rows of one capacity bucket, and the graphs captured over them."""

    def __init__(self, model, capacity: int):
        shape = (len(model.blocks), ROWS, model.n_kv_heads, capacity, model.head_dim)
        self.capacity = capacity
        self.k = torch.zeros(shape, dtype=model.dtype, device=model.device)
        self.v = torch.zeros(shape, dtype=model.dtype, device=model.device)
        self.owners: list[weakref.ref | None] = [None] * ROWS
        self.graphs: dict[int, tuple] = {}  # rows -> (torch.cuda.CUDAGraph, its output tensor)

    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    def owner(self, row: int):
        """The cache holding `row` (None: free). A cache that reallocated its buffer has left the row."""
        ref = self.owners[row]
        cache = ref() if ref is not None else None
        if cache is not None and cache.k.data_ptr() != self.k[:, row].data_ptr():
            cache = None
        if cache is None:
            self.owners[row] = None
        return cache

    def row_of(self, cache) -> int | None:
        for r in range(ROWS):
            if self.owners[r] is not None and self.owner(r) is cache:
                return r
        return None

    def lend(self, row: int, cache) -> None:
        """Move `cache`'s valid KV into `row` and make the cache a view of it."""
        n = cache.length
        self.k[:, row : row + 1, :, :n] = cache.k[:, :, :, :n]
        self.v[:, row : row + 1, :, :n] = cache.v[:, :, :, :n]
        cache.k, cache.v = self.k[:, row : row + 1], self.v[:, row : row + 1]
        self.owners[row] = weakref.ref(cache)

    def take_back(self, row: int) -> None:
        """Give `row`'s cache a buffer of its own again (a copy of the row), and free the row."""
        cache = self.owner(row)
        if cache is not None:
            cache.k, cache.v = cache.k.clone(), cache.v.clone()
        self.owners[row] = None


class StaticDecode:
    """A runner's static decode step: its pools, its inputs and its captured graphs."""

    def __init__(self, model, plan, fuse: bool = False):
        self.model, self.plan = model, plan
        # fuse: torch.compile (Inductor) the step before capturing it, so the glue between matmuls
        # (norms, rotary, adds) becomes a few fused kernels inside the graph. Off by default: each
        # (rows, bucket) then compiles on first use (tens of seconds a shape); `python -m engine.bench
        # gpu` measures both on the GPU at hand before it may become the default.
        self.fuse = fuse
        self._run_step = torch.compile(self._step, dynamic=False) if fuse else self._step
        self.pools: dict[int, Pool] = {}
        with torch.inference_mode():
            self.ids = torch.zeros(ROWS, dtype=torch.long, device=model.device)
            self.pos = torch.zeros(ROWS, dtype=torch.long, device=model.device)
        self.failed: str | None = None  # why capturing failed here (then the step runs uncaptured)
        self.captures: list[dict] = []  # each capture: rows, capacity, ms, and whether inside a step
        self._mempool = None
        self._lock = threading.RLock()

    # --- the step itself --------------------------------------------------------------------------

    def _step(self, pool: Pool, rows: int) -> torch.Tensor:
        """The step over rows [0, rows) of `pool`: reads self.ids/self.pos, writes each row's new KV at
        its position, returns float32 logits [rows, vocab]. Nothing here reads a value on the host."""
        m = self.model
        ids, pos = self.ids[:rows], self.pos[:rows]
        keys, values = pool.k[:, :rows], pool.v[:, :rows]
        H, KV, D = m.n_heads, m.n_kv_heads, m.head_dim
        group = H // KV
        row_idx = torch.arange(rows, device=ids.device)
        visible = (torch.arange(pool.capacity, device=ids.device)[None, :] <= pos[:, None])[:, None, None, :]
        linear = Projections([1] * rows, self.plan.linears).linear

        def attend(i, blk, q, k, v):  # q [1, H, rows, D]; k, v [1, KV, rows, D]
            layer_k, layer_v = keys[i], values[i]  # [rows, KV, C, D]
            layer_k[row_idx, :, pos] = k[0].transpose(0, 1)
            layer_v[row_idx, :, pos] = v[0].transpose(0, 1)
            # the query heads sharing a KV head act as that head's query rows: no KV expansion, and a
            # mask the memory-efficient kernels take (heads h = j * group + g, as Llama's repeat_kv)
            qg = q[0].transpose(0, 1).reshape(rows, KV, group, D)
            out = F.scaled_dot_product_attention(qg, layer_k, layer_v, attn_mask=visible, scale=blk.scaling)
            return out.reshape(rows, H, D)

        x = blocks(m, m.embed(ids[None]), m.cos[pos], m.sin[pos], linear, attend)
        return linear("lm_head", m.lm_head, m.norm(x))[0].float()

    # --- placing sequences in a pool -------------------------------------------------------------

    def pool(self, capacity: int) -> Pool:
        if capacity not in self.pools:
            with torch.inference_mode():
                self.pools[capacity] = Pool(self.model, capacity)
        return self.pools[capacity]

    def _place(self, caches) -> tuple[Pool, list[int]] | None:
        """Put `caches` in rows [0, B) of one pool (moving as few as it can); their rows, or None when
        they cannot take the static step (too many, or too long for the context window)."""
        B = len(caches)
        if B > ROWS:
            return None
        need = bucket(max(c.length for c in caches) + 2, self.model.max_context)
        if need is None:
            return None
        current = [p.capacity for p in self.pools.values() if p.capacity >= need
                   and any(p.row_of(c) is not None for c in caches)]
        pool = self.pool(max(current, default=need))
        rows = [pool.row_of(c) for c in caches]
        keep = {r for r in rows if r is not None and r < B}
        free = iter(r for r in range(B) if r not in keep)
        for b, cache in enumerate(caches):
            if rows[b] is not None and rows[b] < B:
                continue
            r = next(free)
            pool.take_back(r)  # another sequence's row: it gets its own copy
            if rows[b] is not None:
                pool.owners[rows[b]] = None  # it moves within the pool
            pool.lend(r, cache)
            rows[b] = r
        for r in range(B, _size(B)):  # padding rows write the scratch position: it must not hold KV
            held = pool.owner(r)
            if held is not None and not fits(held, pool.capacity):
                pool.take_back(r)
        return pool, rows

    # --- running and capturing --------------------------------------------------------------------

    @torch.inference_mode()
    def step(self, tokens, caches, replay: bool) -> torch.Tensor | None:
        """One token for each cache (tokens[b] at position caches[b].length): logits [B, vocab] in the
        caller's order; replayed from a CUDA graph where `replay` (captured on first use). None: these
        sequences cannot take the static step (the caller runs the eager forward)."""
        with self._lock:
            placed = self._place(caches)
            if placed is None:
                return None
            pool, rows = placed
            size = _size(len(caches))
            ids = torch.full((size,), 0, dtype=torch.long)
            pos = torch.full((size,), pool.capacity - 1, dtype=torch.long)  # padding: the scratch position
            for b, (tok, cache) in enumerate(zip(tokens, caches)):
                ids[rows[b]], pos[rows[b]] = int(tok), cache.length
            self.ids[:size].copy_(ids, non_blocking=True)
            self.pos[:size].copy_(pos, non_blocking=True)
            graph = self._graph(pool, size, in_step=True) if replay else None
            if graph is not None:
                graph[0].replay()
                logits = graph[1]
            else:
                logits = self._step(pool, size)
            for cache in caches:
                cache.length += 1
            return logits[torch.tensor(rows, device=logits.device)] if rows != list(range(len(rows))) \
                else logits[: len(rows)].clone()

    def capture(self, capacity: int, sizes=SIZES) -> float:
        """Capture the graphs of `sizes` over the pool of `capacity` (those not yet captured): seconds taken."""
        t0 = clock.done_s(self.model.device)
        with self._lock, torch.inference_mode():
            for size in sizes:
                self._graph(self.pool(capacity), size, in_step=False)
        return clock.done_s(self.model.device) - t0

    def _graph(self, pool: Pool, size: int, in_step: bool):
        """The graph of `size` rows over `pool`, captured now if it is not yet (None: no graphs here)."""
        if pool.graphs.get(size) is not None or self.failed:
            return pool.graphs.get(size)
        if self.model.device.type != "cuda":
            self.failed = "CUDA graphs need a CUDA device"
            return None
        t0 = clock.now_ns()
        ids, pos = self.ids[:size].clone(), self.pos[:size].clone()
        for r in range(size):  # warm-up and capture write at the scratch position of every row
            held = pool.owner(r)
            if held is not None and not fits(held, pool.capacity):
                pool.take_back(r)
        self.ids[:size].zero_()
        self.pos[:size].fill_(pool.capacity - 1)
        try:
            stream = torch.cuda.Stream(self.model.device)
            stream.wait_stream(torch.cuda.current_stream(self.model.device))
            with torch.cuda.stream(stream):
                for _ in range(2):  # kernels pick their algorithms (Inductor compiles) outside the capture
                    self._run_step(pool, size)
            torch.cuda.current_stream(self.model.device).wait_stream(stream)
            if self._mempool is None:
                self._mempool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            # thread_local: another thread's CUDA call (engine info reading free memory) must not
            # invalidate this capture, as the default ("global") mode would
            with torch.cuda.graph(graph, pool=self._mempool, capture_error_mode="thread_local"):
                out = self._run_step(pool, size)
            clock.sync(self.model.device)  # an asynchronous failure surfaces here, inside the try
        except Exception as exc:  # a kernel that cannot be captured: the uncaptured step serves, once decided
            self.failed = f"CUDA graph capture failed ({type(exc).__name__}: {first_line(exc)[:200]})"
            return None
        finally:
            self.ids[:size].copy_(ids)
            self.pos[:size].copy_(pos)
        pool.graphs[size] = (graph, out)
        self.captures.append({"rows": size, "capacity": pool.capacity, "in_step": in_step,
                              "ms": round((clock.now_ns() - t0) / 1e6, 1)})
        return pool.graphs[size]

    def describe(self) -> dict:
        """Engine info: the pools, the graphs captured, and why not where they could not be."""
        with self._lock:  # the API thread asks while the worker may be adding a pool
            return {"pools": {c: {"bytes": p.nbytes(), "graphs": sorted(p.graphs)} for c, p in self.pools.items()},
                    "captures": list(self.captures), "fused": self.fuse, "failed": self.failed}


def _size(n: int) -> int:
    return next(s for s in SIZES if s >= n)


def serves(lengths, all_logits: bool) -> bool:
    """Whether a forward of `lengths` rows per sequence can take the static step (where the plan runs
    it: on a GPU): one token for each of at most ROWS sequences, no verification."""
    return not all_logits and len(lengths) <= ROWS and all(n == 1 for n in lengths)
