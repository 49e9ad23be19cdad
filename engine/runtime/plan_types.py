"""The execution plan's value types: `Plan` (frozen: what runs per step for one model variant on one
device), `LinearPlan` (a projection role's kernel per row bucket) and `Decision` (one measured or ruled
choice). engine/runtime/plan.py makes them (`make_plan`, the one place a kernel is chosen); the runner
reads them. Kept apart so the rules and the races read on their own (plan.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from engine.kernels import cpu_attention, cpu_layers, cpu_qdot, switches
from engine.kernels.catalogue import Kernel

ALL = 1 << 62  # a bucket's bound that every row count meets
ROLES = ("qkv", "o", "gate_up", "down", "lm_head")
ONE_ROW_NAMES = {"packed": "packed oneDNN weights", "gemv": "MKL GEMV", "ours": "our panel kernel"}


@dataclass(frozen=True)
class Decision:
    """One choice the plan made: what, which, where from ('rule ...', 'measured', 'cached (DATE)',
    'injected', 'default'), and the figures behind it (a race's medians)."""

    what: str
    choice: str
    source: str
    measured: Mapping | None = None

    def to_dict(self) -> dict:
        return {**asdict(self), "measured": dict(self.measured) if self.measured else None}


@dataclass(frozen=True)
class LinearPlan:
    """One projection role's kernels: (max rows of ONE sequence, kernel), ascending; the last serves all.
    `exact`: a plain fp32 Linear, whose rows must get the same bits whoever shares the forward."""

    buckets: tuple[tuple[int, Kernel], ...]
    exact: bool = False

    def kernel(self, rows: int) -> Kernel:
        for most, kernel in self.buckets:
            if rows <= most:
                return kernel
        return self.buckets[-1][1]

    def per_sequence(self, kernel: Kernel) -> bool:
        """Whether a batched forward calls `kernel` once per sequence (not row-invariant, exact role)."""
        return self.exact and not kernel.row_invariant

    def describe(self) -> list:
        return [[None if most >= ALL else most, kernel.short] for most, kernel in self.buckets]


@dataclass(frozen=True)
class Plan:
    device: str  # 'cpu', 'cuda', ...: the device the plan is for
    weights: str  # the variant's name ('fp32', 'int4wo+head', ...)
    runner: str  # 'fast' (our forward) | 'transformers' (the generic forward)
    linears: Mapping[str, LinearPlan]
    attention: str  # decode rows' attention: 'ours-cpu' | 'sdpa' | 'transformers'
    layer_loop: str  # 'cpp' | 'python' | 'transformers'
    cpp_rows: int  # a forward whose sequences have at most this many rows runs the C++ loop (0: never; ALL: any)
    step_modes: Mapping[str, str | None]  # 'eager', 'static', 'inductor', 'cuda_graph' -> None (can serve) or why not
    decisions: tuple[Decision, ...] = ()
    reasons: Mapping[str, str] = field(default_factory=dict)  # why not, for engine info: attention, layer_loop, ...
    kv_attention: Mapping[str, str] = field(default_factory=dict)  # KV precision (not 'model') -> 'ours-cpu-kv' | 'sdpa'
    w8a_form: str | None = None  # the w8a layers' form of our integer kernels (cpu_qdot.ISAS; None: the torch reference)
    loop_kv: tuple[str, ...] = ("model",)  # the KV cache precisions the C++ layer loop reads (KVCache.kind)
    # a decode step's final norm folded into the lm_head's integer product (engine/quant/w8a.py normed_product):
    # where one-row head rows take WO_INT8ACT in a form of our kernels and the norm is fp32
    head_norm: bool = False
    # the w8a weight kinds (1 int8, 2 4-bit) whose row kernels do not ask for their weights 4 KB ahead but leave
    # the stream to the hardware's prefetchers (plan.w8a_hardware_stream's rule)
    w8a_hardware_stream: tuple[int, ...] = ()

    def attention_for(self, kv: str) -> str:
        """Decode rows' attention over a cache of precision `kv` (KVCache.kind)."""
        return self.attention if kv == "model" else self.kv_attention.get(kv, "sdpa")

    def loop_rows(self, kvs) -> int:
        """`cpp_rows` for a forward over caches of precisions `kvs`: the C++ layer loop (cpu_layers.cpp) where
        it reads every one of them (`loop_kv`), else 0 (the Python loop)."""
        return self.cpp_rows if all(kv in self.loop_kv for kv in kvs) else 0

    @property
    def compiled_mode(self) -> str:
        """What the compiled-step toggle runs on this device: Inductor's graph on CPU, CUDA graphs on a GPU."""
        return "cuda_graph" if self.device == "cuda" else "inductor"

    @property
    def compiled_reason(self) -> str | None:
        """Why the compiled-step toggle cannot serve these weights here (None: it can)."""
        return self.step_modes[self.compiled_mode]

    def decision(self, what: str) -> Decision | None:
        return next((d for d in self.decisions if d.what == what), None)

    @property
    def one_row(self) -> str | None:
        """The fp32 one-row choice ('ours', 'packed', 'gemv'; None: no plain fp32 projection here)."""
        d = self.decision("fp32 one-row")
        return d.choice if d else None

    def used(self, rows: int) -> str:
        """The kernels the projections (blocks and head) run on for a sequence of `rows` rows, by short
        name ('ours-fp32', or 'wo-ours+aten' where the head differs): engine info and timelines."""
        if self.runner == "transformers":
            return "transformers"
        return "+".join(dict.fromkeys(self.linears[r].kernel(rows).short for r in ROLES))

    def roof(self, rows: int) -> str | None:
        """The matmul peak a forward of `rows` rows is held to (the roofline's prefill fraction): "int8" where
        the decoder's projections run integer dot products (Kernel.roof), None for the model's dtype."""
        return self.linears["qkv"].kernel(rows).roof if self.runner != "transformers" else None

    def for_reply(self, prefill_rows: int, mode: str = "eager") -> dict:
        """A reply's timeline (`counters.kernels`): what its prefill and its decode steps ran on."""
        decode = self.used(1)
        if mode == "compiled":
            decode = ("CUDA graph replay of the static step (engine/runtime/cuda_graph.py)" if self.device == "cuda"
                      else "compiled graph (engine/runtime/compiled.py)")
        return {"prefill": self.used(max(1, prefill_rows)), "decode": decode}

    @property
    def attention_text(self) -> str:
        if self.attention == cpu_attention.PLAN_NAME:
            return cpu_attention.NAME
        return f"{cpu_attention.SDPA} ({self.reasons.get('attention', self.attention)})"

    @property
    def kv_attention_text(self) -> str:
        """What reads a cache kept at fp16, bf16 or int8 (the kv_cache_dtype toggle)."""
        if self.kv_attention and all(a == cpu_attention.PLAN_NAME_KV for a in self.kv_attention.values()):
            loop = "one C++ call" if set(self.kv_attention) <= set(self.loop_kv) else \
                f"Python ({self.reasons.get('layer_loop', 'the plan keeps these precisions off the C++ loop')})"
            return f"{cpu_attention.NAME_KV}; the layers in {loop}"
        why = self.reasons.get("kv_attention", "this model runs the generic transformers forward")
        return f"{cpu_attention.SDPA} over the cache dequantized each layer ({why})"

    @property
    def layer_loop_text(self) -> str:
        return cpu_layers.NAME if self.layer_loop == "cpp" else f"{cpu_layers.PYTHON} ({self.reasons.get('layer_loop')})"

    @property
    def compiled_machine_reason(self) -> str | None:
        """Why no variant of this model can take the compiled step on this machine (the toggle is off)."""
        return self.reasons.get("compiled_machine")

    @property
    def weight_only_text(self) -> str | None:
        """What the weight-only layers decode with (None: there are none)."""
        return self.reasons.get("weight_only")

    def notes(self) -> list[str]:
        """The measured or ruled choices in one line each (load notes, bench bandwidth)."""
        out = []
        d = self.decision("fp32 one-row")
        if d:
            m = d.measured or {}
            if not m.get("gemv_ms"):
                out.append(f"fp32 one-row matmuls: {ONE_ROW_NAMES[d.choice]} ({d.source})")
            else:
                ours = f", {m['ours_ms']} ms ours" if m.get("ours_ms") is not None else ""
                out.append(f"fp32 one-row matmuls: {ONE_ROW_NAMES[d.choice]} (a step {m['packed_ms']} ms packed, "
                           f"{m['gemv_ms']} ms GEMV{ours}, measured with {m['threads']} threads; {d.source})")
        d = self.decision("weight-only kernels")
        if d:
            m = d.measured or {}
            figures = f"a step {m['ours_ms']} ms ours, {m['torch_ms']} ms torch's; " if m.get("ours_ms") else ""
            out.append(f"decode kernels: {d.choice} ({figures}{d.source})")
        return out

    def describe(self) -> dict:
        """Engine info's `kernels`: what serves a prompt and a decode step, the plan behind it, what each
        short name means, and each kernel switch (engine/kernels/switches.py)."""
        d = self.decision("fp32 one-row")
        one_row = {"choice": d.choice, "source": d.source, **(d.measured or {})} if d else \
            {"choice": None, "source": "no plain fp32 projection on CPU"}
        return {"prefill": self.used(64), "decode": self.used(1), "one_row": one_row,
                "names": {k.short: k.what for k in Kernel}, "switches": switches.describe(),
                "device": self.device, "weights": self.weights, "attention": self.attention,
                "layer_loop": self.layer_loop, "cpp_rows": None if self.cpp_rows >= ALL else self.cpp_rows, "loop_kv": list(self.loop_kv),
                "kv_attention": dict(self.kv_attention),
                "w8a_form": self.w8a_form, "w8a_hardware_stream": [cpu_qdot.KIND_NAMES[k] for k in self.w8a_hardware_stream], "head_norm": self.head_norm,
                "linears": {role: lp.describe() for role, lp in self.linears.items()},
                "step_modes": dict(self.step_modes), "decisions": [d.to_dict() for d in self.decisions]}
