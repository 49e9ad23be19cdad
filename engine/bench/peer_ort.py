"""ONNX Runtime GenAI as the second peer of `python -m engine.bench peer` (engine/bench/peer.py).

Set up once, fully offline, in a venv of its own (never a dependency of this project):

    python3 -m venv /work/peers/ort-venv
    /work/peers/ort-venv/bin/pip install onnxruntime-genai onnx onnx_ir transformers \\
        torch==2.13.0   # the builder needs torch; a local wheel serves where one is on disk
    M=~/.cache/latency-lab/models/SmolLM2-135M-Instruct.*    # the bundled model's cached transformers folder
    HF_HUB_OFFLINE=1 /work/peers/ort-venv/bin/python -m onnxruntime_genai.models.builder \\
        -m $M -o /work/peers/ort-smollm2-int4 -p int4 -e cpu --extra_options accuracy_level=4
    HF_HUB_OFFLINE=1 /work/peers/ort-venv/bin/python -m onnxruntime_genai.models.builder \\
        -m $M -o /work/peers/ort-smollm2-fp32 -p fp32 -e cpu

`-p int4 -e cpu` makes MatMulNBits layers: 4-bit symmetric weights in blocks of 32 (lm_head included);
`accuracy_level=4` (the CPU default, said explicitly) quantizes the activations to int8 per block,
the scheme of our `int4w8a` variants. The bench then passes `--ort-python /work/peers/ort-venv/bin/python
--ort-models /work/peers/ort-smollm2-int4,/work/peers/ort-smollm2-fp32`: each model runs the same token
ids as ours, greedy, with as many intra-op threads as ours.
"""

from __future__ import annotations

import json
import os
import subprocess

from engine.cli import comma_list

# The peer side, run by the ORT venv's python: token ids in, per-token timestamps out.
ORT_SCRIPT = r"""
import json, sys, time
import onnxruntime_genai as og
job = json.load(sys.stdin)
config = og.Config(job["model"])
config.overlay(json.dumps({"model": {"decoder": {"session_options": {
    "intra_op_num_threads": job["threads"], "inter_op_num_threads": 1}}}}))
model = og.Model(config)

def generator(n):
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=n)
    return og.Generator(model, params)

def run(ids, n, g=None):
    g = g or generator(len(ids) + n + 8)
    t0, times, cpu = time.perf_counter(), [], []
    g.append_tokens(ids)
    while not g.is_done() and len(times) < n:
        g.generate_next_token()
        g.get_next_tokens()
        times.append(time.perf_counter())
        cpu.append(time.process_time())
    decode = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else None
    cpu_ms = (cpu[-1] - cpu[0]) * 1e3 / (len(cpu) - 1) if len(cpu) > 1 else None
    return {"ttft_ms": (times[0] - t0) * 1e3, "decode_tps": decode, "cpu_ms_per_token": cpu_ms, "tokens": len(times)}

out = {"version": og.__version__, "model": job["model"]}
out["short"] = run(job["short"], job["max_tokens"])
out["long"] = run(job["long"], job["max_tokens"])
g = generator(len(job["warm"]) + job["warm_tokens"] + 8)
g.append_tokens(job["history"])  # the conversation so far is in this generator's KV
out["warm"] = run(job["warm"][len(job["history"]):], job["warm_tokens"], g)
print(json.dumps(out))
"""


def add_args(p):
    p.add_argument("--ort-python", default=os.environ.get("ORT_GENAI_PYTHON", ""),
                   help="the python of a venv with onnxruntime-genai (engine/bench/peer_ort.py says how); "
                        "empty: ONNX Runtime GenAI is not measured")
    p.add_argument("--ort-models", default=os.environ.get("ORT_GENAI_MODELS", ""), type=comma_list(),
                   help="comma-separated folders of models exported by its builder (int4, fp32, ...)")


def label(folder: str) -> str:
    return "ort-genai " + os.path.basename(folder.rstrip("/")).replace("ort-smollm2-", "")


def jobs(args, job: dict) -> dict[str, dict]:
    """label -> the job for each exported model (none where --ort-python is not given)."""
    if not args.ort_python:
        return {}
    from engine.core.errors import LatencyLabError

    if not os.path.exists(args.ort_python):
        raise LatencyLabError(f"no ONNX Runtime GenAI venv at {args.ort_python} (engine/bench/peer_ort.py says how)")
    folders = args.ort_models
    missing = [f for f in folders if not os.path.exists(os.path.join(f, "genai_config.json"))]
    if not folders or missing:
        raise LatencyLabError(f"--ort-models: no exported model at {missing or '(none given)'} "
                              "(engine/bench/peer_ort.py gives the builder's command)")
    return {label(f): {**job, "model": f} for f in folders}


def run_peer(args, job: dict) -> dict:
    r = subprocess.run([args.ort_python, "-c", ORT_SCRIPT], input=json.dumps(job), capture_output=True,
                       text=True, timeout=1200)
    if r.returncode != 0:
        from engine.core.errors import LatencyLabError

        raise LatencyLabError(f"onnxruntime-genai failed ({args.ort_python}): {r.stderr.strip()[-400:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])
