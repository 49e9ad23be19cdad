"""Did B change the replies? Per pair of replies (the same item through A and B): identical or
not, and where they part; over a set: how many are identical and B's token agreement with A.

Which figure leads derives from the toggle declarations (engine/core/toggles.py `keeps_reply`):
where every setting that differs between A and B is lossless and both are greedy, the replies
should be identical (in fp32: the engine's correctness invariant), so the count of identical ones
and the first differing token lead; otherwise (a weights variant, bf16, sampling) a quality delta:
token agreement with A and the rate of identical replies. Pure functions: no engine, no Gradio.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from engine.core.config import SAMPLING, TOGGLES

from ..chat.settings import PAGE_SETTINGS

DECLARED = {t.name: t for t in (*SAMPLING, *TOGGLES, *PAGE_SETTINGS)}


# Not toggles, but they change what answers or what it is asked: never lossless.
UNDECLARED = ("system", "backend")


def _keeps_reply(name: str) -> bool:
    return name in DECLARED and DECLARED[name].keeps_reply


def changed_settings(settings_a: dict, settings_b: dict) -> list[str]:
    """The settings whose values differ between the two configs (unset = the default)."""
    out = [n for n in UNDECLARED if ((settings_a or {}).get(n) or "") != ((settings_b or {}).get(n) or "")]
    for name, t in DECLARED.items():
        va, vb = (settings_a or {}).get(name, t.default), (settings_b or {}).get(name, t.default)
        if t.kind == "variant":
            va, vb = va or None, vb or None
        if va != vb:
            out.append(name)
    return out


def pair_kind(settings_a: dict, settings_b: dict) -> tuple[str, list[str]]:
    """("lossless" | "lossy" | "sampled", the changed settings): lossless when both are greedy and
    every changed setting is declared lossless."""
    changed = changed_settings(settings_a, settings_b)
    greedy = all((s or {}).get("temperature", DECLARED["temperature"].default) == 0 for s in (settings_a, settings_b))
    if not greedy:
        return "sampled", changed
    lossy = [n for n in changed if not _keeps_reply(n) and n != "max_new_tokens"]
    return ("lossy" if lossy else "lossless"), changed


@dataclass
class ReplyPair:
    item: object
    identical: bool
    first_diff: int | None  # index of the first differing token (None: identical)
    a_token: str | None = None  # that token's text in A's reply and in B's (None: the reply ended)
    b_token: str | None = None
    common: int = 0  # tokens before the first difference
    a_tokens: int = 0


@dataclass
class RepliesSummary:
    kind: str  # lossless | lossy | sampled
    changed: list[str]
    n: int
    identical: int
    token_agreement: float | None  # B's tokens equal to A's before the replies part, over A's tokens
    pairs: list[ReplyPair] = field(default_factory=list)
    compute_dtypes: list[str] = field(default_factory=list)

    @property
    def identical_rate(self) -> float | None:
        return self.identical / self.n if self.n else None

    @property
    def first_different(self) -> ReplyPair | None:
        return next((p for p in self.pairs if not p.identical), None)

    def to_dict(self) -> dict:
        return {**asdict(self), "identical_rate": self.identical_rate}


def compare_pair(item, a: dict, b: dict, decode=None) -> ReplyPair:
    """`a`, `b`: a reply's `token_ids` (or, without them, `reply` text: its characters stand in)."""
    ta, tb = a.get("token_ids"), b.get("token_ids")
    if ta is None or tb is None:
        ta, tb, decode = list(a.get("reply") or ""), list(b.get("reply") or ""), "".join
    ta, tb = list(ta), list(tb)
    if ta == tb:
        return ReplyPair(item, True, None, common=len(ta), a_tokens=len(ta))
    i = next((k for k, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb)))

    def text(ids, k):
        if k >= len(ids):
            return None
        return decode([ids[k]]) if decode else str(ids[k])

    return ReplyPair(item, False, i, text(ta, i), text(tb, i), common=i, a_tokens=len(ta))


def summarize(pairs: list[tuple[object, dict, dict]], settings_a: dict, settings_b: dict, decode=None,
              compute_dtypes: list[str] | None = None) -> RepliesSummary:
    """`pairs`: (item, A's reply, B's reply) with `token_ids` or `reply` each."""
    kind, changed = pair_kind(settings_a, settings_b)
    compared = [compare_pair(item, a, b, decode) for item, a, b in pairs]
    total = sum(p.a_tokens for p in compared)
    agreement = sum(p.common for p in compared) / total if total else None
    return RepliesSummary(kind, changed, len(compared), sum(p.identical for p in compared), agreement, compared,
                          sorted({d for d in compute_dtypes or [] if d}))


def sentence(s: RepliesSummary) -> str:
    """'8 of 8 replies identical' / '7 of 8 replies identical; item 3 parts at token 12 (A " Paris",
    B " London")' / 'token agreement with A 86%, 3 of 8 replies identical'."""
    if not s.n:
        return ""
    count = f"{s.identical} of {s.n} replies identical"
    diff = s.first_different
    where = ""
    if diff is not None:
        where = (f"; item {diff.item} parts at token {diff.first_diff + 1} "
                 f"(A {_tok(diff.a_token)}, B {_tok(diff.b_token)})")
    if s.kind == "lossless":
        note = ""
        if diff is not None and any(d != "fp32" for d in s.compute_dtypes):
            note = (f" (lossless in fp32; these ran in {', '.join(s.compute_dtypes)}, where a multi-row matmul "
                    "rounds near-ties differently)")
        return count + where + note
    agree = "—" if s.token_agreement is None else f"{100 * s.token_agreement:.0f}%"
    why = "sampling (temperature > 0)" if s.kind == "sampled" else "lossy: " + ", ".join(
        n for n in s.changed if not _keeps_reply(n))
    return f"token agreement with A {agree}, {count}{where} ({why})"


def _tok(text: str | None) -> str:
    return "ended" if text is None else repr(text)
