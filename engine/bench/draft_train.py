"""Distil the bundled draft model: `python -m engine.bench.draft_train [data|train|export|all]`.

The draft for SmolLM2-135M-Instruct is a small Llama (a few layers at width 576) that shares the
target's token embeddings and output head, so only its layers and final norm are trained and
shipped (assets/, safetensors). Its head covers only the target tokens seen most often in the
target's replies (a frequency-ranked vocabulary subset): a draft token then costs a fraction of
the full 49,152-row head, and verification stays exact because q = 0 outside the subset.

Stages (each resumes from what the previous wrote into --work):
  data   the target answers a varied prompt set (engine/speculative/draft_prompts.py) greedily (--sampled adds
         T=0.7 replies), in batches; for every reply position we keep its top-K log-probabilities
  train  the draft learns KL(target || draft) on those positions (teacher top-K, renormalised)
  export writes the draft's own weights (bf16) and the head's token ids into assets/
Run it with `nice`: the CPU here is shared.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch

from engine.cli import comma_list
from engine.core import clock
from engine.speculative.draft import (
    BUNDLED_DRAFT_DIR as ASSET_DIR,  # written where it loads from
)

TOP_K = 32


def log(*parts):
    print(time.strftime("%H:%M:%S"), *parts, flush=True)


# --- data: the target's own replies and its top-K log-probs -------------------------------------
def make_data(args) -> None:
    from transformers import AutoModelForCausalLM

    from engine.bench.spec_prompts import BENCH_PROMPTS
    from engine.core.config import LoadConfig
    from engine.model.loader import load
    from engine.speculative.draft_prompts import training_prompts

    lm = load(LoadConfig(dtype="bf16", progress=False))
    tok = lm.tokenizer
    # eager attention: faster than CPU flash attention for batched one-token steps (docs/speculative.md)
    target = AutoModelForCausalLM.from_pretrained(lm.weights, dtype=torch.bfloat16, attn_implementation="eager").eval()
    del lm
    prompts = training_prompts(exclude=tuple(BENCH_PROMPTS))
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    # greedy replies (what the benches measure; the page's default T=0.2 is near-greedy), and
    # optionally a sampled pass (T=0.7) over the same prompts
    jobs = [(p, mode) for mode in (("greedy", "sample") if args.sampled else ("greedy",)) for p in prompts]
    jobs = jobs[: args.max_replies] if args.max_replies else jobs
    batches = [jobs[i : i + args.batch] for i in range(0, len(jobs), args.batch)]
    eos = [2, tok.convert_tokens_to_ids("<|im_end|>")]
    for b, batch in enumerate(batches):
        shard = work / f"shard_{b:04d}.pt"
        if shard.exists():
            continue
        t0 = clock.now_ns()
        ids = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True)
               for p, _ in batch]
        ids = [list(x["input_ids"]) if hasattr(x, "keys") else list(x) for x in ids]
        width = max(map(len, ids))
        inp = torch.tensor([[2] * (width - len(x)) + x for x in ids])  # left padding
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
        sample = batch[0][1] == "sample"
        torch.manual_seed(1000 + b)
        with torch.inference_mode():
            out = target.generate(inp, attention_mask=mask, max_new_tokens=args.max_new_tokens,
                                  do_sample=sample, temperature=0.7 if sample else None, top_p=0.9 if sample else None,
                                  top_k=None, eos_token_id=eos, pad_token_id=2,
                                  output_logits=True, return_dict_in_generate=True)
        logits = torch.stack(out.logits, dim=1).float()  # [B, steps, vocab]
        records = []
        for i, prompt_ids in enumerate(ids):
            reply = out.sequences[i, width:].tolist()
            n = next((j + 1 for j, t in enumerate(reply) if t in eos), len(reply))
            logp = logits[i, :n].log_softmax(-1)
            top = logp.topk(TOP_K, dim=-1)
            records.append({"prompt": prompt_ids, "reply": reply[:n], "top_idx": top.indices.to(torch.int32),
                            "top_logp": top.values.to(torch.float16), "mode": batch[i][1]})
        torch.save(records, shard)
        tokens = sum(len(r["reply"]) for r in records)
        log(f"shard {b + 1}/{len(batches)}: {tokens} reply tokens in {(clock.now_ns() - t0) / 1e9:.0f}s")


def load_records(work: Path) -> list[dict]:
    records = []
    for shard in sorted(work.glob("shard_*.pt")):
        records += torch.load(shard)
    return records


# --- train: KL(target || draft) on the target's replies ----------------------------------------
def _target_hf(dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    from engine.core.config import LoadConfig
    from engine.model.loader import load

    lm = load(LoadConfig(dtype="fp32", progress=False, draft_model="none"))
    target = AutoModelForCausalLM.from_pretrained(lm.weights, dtype=dtype).eval()
    for prm in target.parameters():
        prm.requires_grad_(False)
    return target, lm.tokenizer


def choose_vocab(records: list[dict], size: int, vocab_size: int) -> torch.Tensor:
    """The `size` target tokens seen most often in the replies and the teacher's top choices."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for r in records:
        counts += torch.bincount(torch.tensor(r["reply"]), minlength=vocab_size)
        counts += torch.bincount(r["top_idx"][:, 0].long(), minlength=vocab_size)
    counts[2] += 10**9  # <|im_end|> (EOS) is always in
    return counts.argsort(descending=True)[:size].sort().values


def _batches(records: list[dict], tokens_per_batch: int, rng: random.Random | None):
    """Groups of similar-length records, about `tokens_per_batch` tokens each; shuffled when rng given."""
    order = sorted(range(len(records)), key=lambda i: len(records[i]["prompt"]) + len(records[i]["reply"]))
    groups, cur, width = [], [], 0
    for i in order:
        n = len(records[i]["prompt"]) + len(records[i]["reply"])
        if cur and max(width, n) * (len(cur) + 1) > tokens_per_batch:
            groups.append(cur)
            cur, width = [], 0
        cur.append(i)
        width = max(width, n)
    if cur:
        groups.append(cur)
    if rng:
        rng.shuffle(groups)
    return [[records[i] for i in g] for g in groups]


def _batch_loss(draft, head_cols: torch.Tensor, col_of: torch.Tensor, batch: list[dict]):
    """Mean cross-entropy of the draft against the teacher's renormalised top-K over the draft's columns,
    and greedy top-1 agreement (the draft's argmax equals the teacher's)."""
    seqs = [r["prompt"] + r["reply"][:-1] for r in batch]
    width = max(map(len, seqs))
    ids = torch.tensor([s + [2] * (width - len(s)) for s in seqs])  # right padding: causal attention ignores it
    hidden = draft.model(input_ids=ids).last_hidden_state
    rows, tops, logps = [], [], []
    for b, r in enumerate(batch):
        start = len(r["prompt"]) - 1  # the position that predicts the first reply token
        rows.append(hidden[b, start : start + len(r["reply"])])
        tops.append(r["top_idx"].long())
        logps.append(r["top_logp"].float())
    h = torch.cat(rows)
    logq = (h @ head_cols.T).log_softmax(-1)  # [positions, draft columns]
    top, logp = torch.cat(tops), torch.cat(logps)
    cols = col_of[top]  # -1 where the teacher's token is outside the draft's head
    p = logp.exp() * (cols >= 0)
    p = p / p.sum(-1, keepdim=True).clamp_min(1e-9)
    loss = -(p * logq.gather(-1, cols.clamp_min(0))).sum(-1).mean()
    agree = (cols[:, 0] == logq.argmax(-1)).float().mean()
    return loss, agree, h.shape[0]


def _evaluate(draft, head_cols, col_of, records, tokens_per_batch=4096) -> dict:
    total, agree, n = 0.0, 0.0, 0
    with torch.no_grad():
        for batch in _batches(records, tokens_per_batch, None):
            loss, a, m = _batch_loss(draft, head_cols, col_of, batch)
            total, agree, n = total + loss.item() * m, agree + a.item() * m, n + m
    return {"loss": total / n, "top1_agreement": agree / n, "positions": n}


def train(args) -> None:
    from engine.speculative.draft import build_draft_hf, own_state_dict

    work = Path(args.work)
    records = load_records(work)
    if not records:
        raise SystemExit(f"no data in {work}: run `python -m engine.bench.draft_train data` first")
    held = [r for i, r in enumerate(records) if i % 20 == 0]
    train_set = [r for i, r in enumerate(records) if i % 20 != 0]
    target, _ = _target_hf()
    vocab_size = target.config.vocab_size
    vocab = choose_vocab(train_set, args.vocab, vocab_size)
    col_of = torch.full((vocab_size,), -1, dtype=torch.long)
    col_of[vocab] = torch.arange(vocab.numel())
    covered = sum(int((col_of[torch.tensor(r["reply"])] >= 0).sum()) for r in held)
    log(f"{len(train_set)} training replies ({sum(len(r['reply']) for r in train_set):,} tokens), {len(held)} held out; "
        f"head over {vocab.numel():,} tokens covers {covered / sum(len(r['reply']) for r in held):.1%} of held-out reply tokens")

    def fresh(init_layers):
        draft = build_draft_hf(target.config, target.model.embed_tokens, target.lm_head.weight, len(init_layers),
                               vocab, torch.float32)
        for mine, src in zip(draft.model.layers, init_layers):
            mine.load_state_dict(target.model.layers[src].state_dict())
        draft.model.norm.load_state_dict(target.model.norm.state_dict())
        return draft

    n_target = target.config.num_hidden_layers
    L = args.layers
    candidates = [list(range(L)), list(range(L - 1)) + [n_target - 1],
                  [round(i * (n_target - 1) / (L - 1)) for i in range(L)] if L > 1 else [0]]
    if args.init != "auto":
        candidates = [args.init]
    probe = held[: max(8, len(held) // 3)]
    scored = []
    for cand in dict.fromkeys(map(tuple, candidates)):
        candidate = fresh(cand)
        scored.append((_evaluate(candidate, candidate.lm_head.weight, col_of, probe)["loss"], cand))
        log(f"init from target layers {list(cand)}: held-out loss {scored[-1][0]:.3f}")
    init_layers = min(scored)[1]
    draft = fresh(init_layers)
    if args.resume:  # continue from the last checkpoint (a further run of epochs, fresh schedule)
        ckpt = torch.load(work / "draft.pt")
        assert torch.equal(ckpt["vocab"], vocab), "the checkpoint's head tokens differ: same data and --vocab needed"
        draft.load_state_dict(ckpt["state_dict"], strict=False)
        init_layers, prior_epochs = ckpt["init_layers"], ckpt.get("epochs", 0)
        log(f"resumed from {work / 'draft.pt'} after {prior_epochs} epochs: held-out {ckpt['held_out']}")
    else:
        prior_epochs = 0
    head_cols = draft.lm_head.weight  # frozen: rows of the target's head
    params = [p for n, p in draft.named_parameters() if n.startswith(("model.layers.", "model.norm."))]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    rng = random.Random(0)
    torch.manual_seed(0)
    steps_per_epoch = len(_batches(train_set, args.tokens_per_batch, None))
    total_steps, step = steps_per_epoch * args.epochs, 0
    log(f"training {len(params)} tensors ({sum(p.numel() for p in params):,} parameters) from layers {list(init_layers)}, "
        f"{args.epochs} epochs x {steps_per_epoch} batches")
    t0 = clock.now_ns()
    for epoch in range(args.epochs):
        draft.train()
        for batch in _batches(train_set, args.tokens_per_batch, rng):
            warm = min(1.0, (step + 1) / 30)
            for g in opt.param_groups:
                g["lr"] = args.lr * warm * 0.5 * (1 + math.cos(math.pi * step / total_steps))
            loss, agree, _ = _batch_loss(draft, head_cols, col_of, batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            step += 1
            if step % 25 == 0:
                log(f"epoch {epoch + 1} step {step}/{total_steps}: loss {loss.item():.3f}, top-1 {agree.item():.1%}, "
                    f"{(clock.now_ns() - t0) / 1e9:.0f}s")
        draft.eval()
        ev = _evaluate(draft, head_cols, col_of, held)
        log(f"epoch {epoch + 1}: held-out loss {ev['loss']:.3f}, top-1 agreement {ev['top1_agreement']:.1%}")
        sd = {k: v.detach().clone().contiguous() for k, v in own_state_dict(draft).items()}
        torch.save({"state_dict": sd, "vocab": vocab, "layers": L, "init_layers": list(init_layers),
                    "epochs": prior_epochs + epoch + 1, "schedule": f"{args.epochs} epochs at lr {args.lr}",
                    "held_out": ev, "train_s": (clock.now_ns() - t0) / 1e9, "records": len(records)}, work / "draft.pt")
        log(f"saved {work / 'draft.pt'} (after epoch {epoch + 1})")


def export(args) -> None:
    """Write the trained draft into assets/ as safetensors (bf16: what it does not share with the target)."""
    from safetensors.torch import save_file

    ckpt = torch.load(Path(args.work) / "draft.pt")
    ASSET_DIR.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.to(torch.bfloat16) for k, v in ckpt["state_dict"].items()}
    tensors["vocab_ids"] = ckpt["vocab"].to(torch.int32)
    save_file(tensors, str(ASSET_DIR / "draft.safetensors"))
    meta = {"name": f"SmolLM2-135M-Instruct draft ({ckpt['layers']} layers, distilled)", "layers": ckpt["layers"],
            "head_tokens": int(ckpt["vocab"].numel()), "init_from_target_layers": ckpt["init_layers"],
            "held_out": ckpt["held_out"], "train_s": round(ckpt["train_s"]), "replies": ckpt["records"],
            "epochs": ckpt.get("epochs"),
            "made_by": "python -m engine.bench.draft_train all"}
    (ASSET_DIR / "draft.json").write_text(json.dumps(meta, indent=1) + "\n")
    log(f"wrote {ASSET_DIR}: " + ", ".join(f"{p.name} {p.stat().st_size / 1e6:.1f} MB" for p in sorted(ASSET_DIR.iterdir())))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine.bench.draft_train", description=__doc__.splitlines()[0])
    p.add_argument("stage", choices=["data", "train", "export", "all"])
    p.add_argument("--work", default="artifacts/draft", help="where data shards and checkpoints go")
    p.add_argument("--threads", type=int, default=2, help="torch threads (the shipped draft: 1 for data, 2 for train)")
    p.add_argument("--batch", type=int, default=64, help="prompts generated together (data)")
    p.add_argument("--max-new-tokens", type=int, default=192)
    p.add_argument("--max-replies", type=int, default=512,
                   help="replies to generate (0: all); the shipped draft used 512 (8 batches), for time")
    p.add_argument("--sampled", action="store_true", help="also a sampled (T=0.7) reply per prompt")
    p.add_argument("--layers", type=int, default=2, help="draft transformer layers")
    p.add_argument("--vocab", type=int, default=8192, help="target tokens the draft's head covers")
    p.add_argument("--init", default="auto", type=lambda t: t if t == "auto" else comma_list(int, 0)(t),
                   help="target layers to start from, e.g. 0,29 (auto: best of a few)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--tokens-per-batch", type=int, default=1024)
    p.add_argument("--resume", action="store_true", help="train further from the last checkpoint in --work")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.stage in ("data", "all"):
        make_data(args)
    if args.stage in ("train", "all"):
        train(args)
    if args.stage in ("export", "all"):
        export(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
