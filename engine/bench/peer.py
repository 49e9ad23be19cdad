"""Latency Lab against llama.cpp on the same weights and the same token ids, side by side.

llama.cpp runs through llama-cpp-python in a venv of its own (it builds from source, which takes
minutes: docs/history.md; never a dependency of this project): `python3 -m venv /tmp/llama-venv && /tmp/llama-venv/bin/pip
install llama-cpp-python`, then `--peer-python /tmp/llama-venv/bin/python`. It loads the bundled
GGUF (Q4_1) itself; we load the same file dequantized. Both get the prompts as the same token ids
(our tokenizer, the model's chat template) and decode greedily.

Figures per engine, medians over alternating rounds (ours, then the peers; every other round in the
reverse order, so that no engine always runs after the same one):
- decode tok/s after a short prompt, and after a ~1,500-token prompt; beside each, the CPU time per
  decoded token (the process's, all its threads, spinning included: between the first and the last
  token), which a machine shared with other work disturbs far less than the wall clock;
- cold TTFT of the ~1,500-token prompt (nothing cached);
- warm TTFT: the same conversation plus one new turn, its history's KV already cached (llama.cpp
  keeps the previous prompt's KV and reuses the longest common prefix; we use the prefix cache).
`ratio` = our best decode tok/s (short prompt) / llama.cpp's.

`--peer-ggufs A.gguf,B.gguf`: more GGUF files llama.cpp runs in the same rounds, each its own peer (named by
its file), e.g. the bundled weights in F32 and BF16 (scripts/gguf_export.py makes them offline in the
llama-cpp-python venv) beside our fp32 and `bf16wo+head`: what bf16 weights buy llama.cpp on this CPU
against what they buy us.

ONNX Runtime GenAI is the second peer where `--ort-python` and `--ort-models` are given (its venv and
the models its builder exported from the bundled model's cached transformers folder, offline:
engine/bench/peer_ort.py gives the commands): the same token ids, in the same rounds, after llama.cpp.
Its int4 export quantizes the activations to int8 per block of 32 (accuracy level 4), as our `w8a`
variants do. Each peer's ratio is printed; `ratio` stays llama.cpp's.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import time
from pathlib import Path

from engine.cli import comma_list
from engine.bench import CHAT_PROMPTS, load_model, median, peer_ort, run_request
from engine.bench.kv import ARTICLE

# The peer side, run by the peer venv's python: token ids in, per-token timestamps out.
PEER_SCRIPT = r"""
import json, sys, time
import llama_cpp.llama_cpp as lib
from llama_cpp import Llama
job = json.load(sys.stdin)
if not job.get("extra_bufts", True):  # without its extra buffer types: AMX and repacked weights (peer() says why)
    defaults = lib.llama_model_default_params
    def no_extra():
        p = defaults()
        p.use_extra_bufts = False
        return p
    lib.llama_model_default_params = no_extra
llm = Llama(model_path=job["gguf"], n_ctx=4096, n_threads=job["threads"], n_batch=512, verbose=False)

def run(ids, n, cold=True):
    if cold:
        llm.reset()  # forget the previous prompt's KV; otherwise generate() reuses the longest common prefix
    t0, times, cpu = time.perf_counter(), [], []
    for token in llm.generate(ids, temp=0.0, top_k=1):
        times.append(time.perf_counter())
        cpu.append(time.process_time())
        if len(times) >= n or token == llm.token_eos():
            break
    decode = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else None
    cpu_ms = (cpu[-1] - cpu[0]) * 1e3 / (len(cpu) - 1) if len(cpu) > 1 else None
    return {"ttft_ms": (times[0] - t0) * 1e3, "decode_tps": decode, "cpu_ms_per_token": cpu_ms, "tokens": len(times)}

out = {"version": __import__("llama_cpp").__version__, "extra_bufts": job.get("extra_bufts", True)}
out["short"] = run(job["short"], job["max_tokens"])
out["long"] = run(job["long"], job["max_tokens"])
run(job["history"], 1)  # the conversation so far is now in llama.cpp's KV
out["warm"] = run(job["warm"], job["warm_tokens"], cold=False)
print(json.dumps(out))
"""


def add_args(p):
    p.add_argument("--peer-python", default=os.environ.get("LLAMA_CPP_PYTHON", "/tmp/llama-venv/bin/python"),
                   help="the python of a venv with llama-cpp-python installed")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (ours, then the peers; every other round reversed)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens decoded per measured reply")
    p.add_argument("--warm-tokens", type=int, default=8, help="tokens generated in the warm-TTFT turn")
    p.add_argument("--peer-ggufs", default="", type=comma_list(),
                   help="more GGUF files llama.cpp runs, each its own peer beside the bundled Q4_1 (e.g. the same "
                        "weights in F32 and BF16, made offline by scripts/gguf_export.py)")
    p.add_argument("--compare-variants", default="", type=comma_list(),
                   help="also measure these weight variants of ours (comma-separated, e.g. int8wo)")
    p.add_argument("--compiled", action="store_true",
                   help="run ours with the compiled decode step too (compiled once, before the rounds)")
    peer_ort.add_args(p)


def conversation() -> tuple[list[dict], list[dict]]:
    """A ~1,500-token chat history and the same history plus one new user turn."""
    history = []
    for i, ask in enumerate(("Summarize the main problems.", "Which change would you try first?",
                             "How could we waste less bread?", "What are the risks of Sunday opening?")):
        history += [{"role": "user", "content": f"Notes, part {i + 1}:\n\n{ARTICLE}\n\n{ask}"},
                    {"role": "assistant", "content": "Here is a short answer based on the notes above."}]
    return history, history + [{"role": "user", "content": "Give us a plan for next year in three bullets."}]


def token_ids(tokenizer, messages, reply_open: bool = True) -> list[int]:
    return tokenizer.apply_chat_template(messages, add_generation_prompt=reply_open, tokenize=True,
                                         return_dict=False)


class _CpuPerToken:
    """The process's CPU time per decoded token over a reply's decode (first chunk to last): on_event."""

    def __init__(self):
        self.marks = []

    def __call__(self, event):
        if event.kind == "chunk" and event.output_tokens:
            self.marks.append((event.output_tokens, time.process_time()))

    def ms(self) -> float | None:
        if len(self.marks) < 2 or self.marks[-1][0] == self.marks[0][0]:
            return None
        (n0, c0), (n1, c1) = self.marks[0], self.marks[-1]
        return (c1 - c0) * 1e3 / (n1 - n0)


def ours(served, ids: dict, args, compiled: bool) -> dict:
    """`served`: (the loaded model, its runner)."""
    model, runner = served
    from engine.core.config import GenerationConfig
    from engine.serving.prefix_cache import PrefixCache

    greedy = GenerationConfig(temperature=0.0, max_new_tokens=args.max_tokens, quantization=None,
                              compiled_decode=compiled)
    cpu_short, cpu_long = _CpuPerToken(), _CpuPerToken()
    short = run_request(model, None, greedy, prompt_ids=ids["short"], runner=runner, on_event=cpu_short).timeline
    long = run_request(model, None, greedy.replace(kv_reuse=False), prompt_ids=ids["long"], runner=runner,
                       on_event=cpu_long).timeline
    cache = PrefixCache()
    run_request(model, None, greedy.replace(max_new_tokens=1), prompt_ids=ids["history"], prefix_cache=cache,
                session="peer", runner=runner)
    warm = run_request(model, None, greedy.replace(max_new_tokens=args.warm_tokens), prompt_ids=ids["warm"],
                       prefix_cache=cache, session="peer", runner=runner).timeline
    return {"short": {"ttft_ms": short.ttft_ms, "decode_tps": short.decode_tps, "cpu_ms_per_token": cpu_short.ms(),
                      "tokens": short.output_tokens},
            "long": {"ttft_ms": long.ttft_ms, "decode_tps": long.decode_tps, "cpu_ms_per_token": cpu_long.ms(),
                     "tokens": long.output_tokens},
            "warm": {"ttft_ms": warm.ttft_ms, "cached_tokens": warm.cached_tokens, "tokens": warm.output_tokens}}


def _ms(v) -> str:
    return "unknown" if v is None else f"{v:.1f} ms"


def peer(args, job: dict) -> dict:
    """llama.cpp's figures for `job`. Where its AMX path dies with an illegal instruction (llama-cpp-python
    0.3.36 on an Intel Xeon family 6 model 207, a KVM guest, 2026-12-06: `tileloadd` in
    ggml_backend_amx_mul_mat on any prompt of many tokens), it runs again without its extra buffer types
    (AMX and repacked weights: its AVX-512 VNNI path), and the result says so (`extra_bufts`: false)."""
    r = subprocess.run([args.peer_python, "-c", PEER_SCRIPT], input=json.dumps(job), capture_output=True,
                       text=True, timeout=1200)
    if r.returncode == -signal.SIGILL and job.get("extra_bufts", True):
        job["extra_bufts"] = False  # the later rounds too, without dying first
        return peer(args, job)
    if r.returncode != 0:
        from engine.core.errors import LatencyLabError

        raise LatencyLabError(f"llama-cpp-python failed ({args.peer_python}): {r.stderr.strip()[-400:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def run(args, out):
    import torch

    from engine.core.errors import LatencyLabError
    from engine.model.loader import bundled_gguf_path
    from engine.platform.capabilities import detect
    from engine.serving.variants import VariantSet

    missing = [g for g in args.peer_ggufs if not os.path.isfile(g)]
    if missing:
        raise LatencyLabError(f"--peer-ggufs: no GGUF file at {missing[0]} (scripts/gguf_export.py makes one)")
    if not os.path.exists(args.peer_python):
        raise LatencyLabError(f"no llama-cpp-python venv at {args.peer_python}: build one (see "
                              "`python -m engine.bench peer --help`) or pass --peer-python")
    lm = load_model(args)
    history, warm = conversation()
    tok = lm.tokenizer
    ids = {"short": token_ids(tok, [{"role": "user", "content": CHAT_PROMPTS[0]}]),
           "long": token_ids(tok, warm), "history": token_ids(tok, history, reply_open=False),
           "warm": token_ids(tok, warm)}
    threads = torch.get_num_threads()
    job = {"gguf": str(bundled_gguf_path()), "threads": threads, "max_tokens": args.max_tokens,
           "warm_tokens": args.warm_tokens, **ids}
    caps = detect()
    out(f"{caps.cpu_model} · {caps.isa_level} · {threads} threads; ours {lm.dtype_name} vs llama.cpp Q4_1; "
        f"prompts: short {len(ids['short'])}, long {len(ids['long'])}, warm {len(ids['warm'])} tokens "
        f"({len(ids['history'])} cached)")
    variant_set = VariantSet(lm, quality_texts=0)
    configs = {}  # label -> ((the loaded model, its runner), compiled step or not): each variant built once
    for v in [None, *args.compare_variants]:
        variant, label = (variant_set.get(v), v) if v else (variant_set.default, lm.dtype_name)
        served = (variant.loaded, variant.runner)
        configs[label] = (served, False)
        if args.compiled:
            variant.runner.prepare("compiled", tok)
            info = variant.runner.compiled_info()
            out(f"  {label} compiled in {info['compile_s']} s (top-1 agreement with its eager "
                f"step {info['top1_agreement']:.0%})")
            configs[f"{label} compiled"] = (served, True)
    ort_jobs = peer_ort.jobs(args, job)
    llama_jobs = {"llama.cpp": job, **{f"llama.cpp {Path(g).stem}": {**job, "gguf": g} for g in args.peer_ggufs}}
    runs = {**{name: [] for name in llama_jobs}, **{name: [] for name in ort_jobs}, **{name: [] for name in configs}}
    turns = [(name, lambda c=c: ours(c[0], ids, args, c[1])) for name, c in configs.items()]
    turns += [(name, lambda j=j: peer(args, j)) for name, j in llama_jobs.items()]
    turns += [(name, lambda j=j: peer_ort.run_peer(args, j)) for name, j in ort_jobs.items()]
    for r in range(args.rounds):  # counterbalanced: every other round in the reverse order
        for name, run in turns if r % 2 == 0 else turns[::-1]:
            runs[name].append(run())
        out(f"  round {r + 1}: " + "; ".join(
            f"{name} decode {x[-1]['short']['decode_tps']:.1f} tok/s, warm TTFT {x[-1]['warm']['ttft_ms']:.0f} ms"
            for name, x in runs.items()))
    table = {name: {
        "decode_tps_short": median([x["short"]["decode_tps"] for x in xs]),
        "decode_tps_long": median([x["long"]["decode_tps"] for x in xs]),
        "cpu_ms_per_token_short": median([x["short"].get("cpu_ms_per_token") for x in xs]),
        "cpu_ms_per_token_long": median([x["long"].get("cpu_ms_per_token") for x in xs]),
        "tokens_short": median([x["short"]["tokens"] for x in xs]),
        "cold_ttft_ms": median([x["long"]["ttft_ms"] for x in xs]),
        "warm_ttft_ms": median([x["warm"]["ttft_ms"] for x in xs]),
    } for name, xs in runs.items()}
    theirs = table["llama.cpp"]
    if not runs["llama.cpp"][0].get("extra_bufts", True):
        out("  llama.cpp: its AMX path died with an illegal instruction here; it ran without its extra buffer "
            "types (AMX, repacked weights)")
    for name, row in table.items():
        out(f"{name:>20}: decode {row['decode_tps_short']:.1f} tok/s short ({_ms(row['cpu_ms_per_token_short'])} "
            f"CPU/token, {row['tokens_short']:.0f} tokens), {row['decode_tps_long']:.1f} after {len(ids['long'])} tokens "
            f"({_ms(row['cpu_ms_per_token_long'])} CPU/token); cold TTFT {row['cold_ttft_ms']:.0f} ms; "
            f"warm TTFT {row['warm_ttft_ms']:.0f} ms")
    peers = [*llama_jobs, *ort_jobs]
    best = max((n for n in table if n not in peers), key=lambda n: table[n]["decode_tps_short"])
    for name in [*list(llama_jobs)[1:], *ort_jobs]:
        out(f"ours ({best}) ÷ {name}: decode {table[best]['decode_tps_short'] / table[name]['decode_tps_short']:.2f}x "
            f"short, {table[best]['decode_tps_long'] / table[name]['decode_tps_long']:.2f}x long; cold TTFT "
            f"{table[name]['cold_ttft_ms'] / table[best]['cold_ttft_ms']:.2f}x faster")
    ratios = {
        "decode_short": table[best]["decode_tps_short"] / theirs["decode_tps_short"],
        "decode_long": table[best]["decode_tps_long"] / theirs["decode_tps_long"],
        "cold_ttft_speedup": theirs["cold_ttft_ms"] / table[best]["cold_ttft_ms"],
        "warm_ttft_ratio": table[best]["warm_ttft_ms"] / theirs["warm_ttft_ms"],
    }
    out(f"ours ({best}) ÷ llama.cpp: decode {ratios['decode_short']:.2f}x short, {ratios['decode_long']:.2f}x long; "
        f"cold TTFT {ratios['cold_ttft_speedup']:.2f}x faster; warm TTFT {ratios['warm_ttft_ratio']:.2f}x theirs")
    return {"ratio": round(ratios["decode_short"], 3), "ratios": {k: round(v, 3) for k, v in ratios.items()},
            "table": table, "best": best, "cpu": caps.cpu_model, "isa": caps.isa_level, "threads": threads,
            "machine": platform.machine(), "peer_version": runs["llama.cpp"][0].get("version"),
            "peer_extra_bufts": runs["llama.cpp"][0].get("extra_bufts", True),
            "ort_genai_version": runs[next(iter(ort_jobs))][0].get("version") if ort_jobs else None,
            "prompt_tokens": {k: len(v) for k, v in ids.items()}}
