"""``anyspec analyze``: how well a draft and a target tokenizer fit together for TLI.

It reports how many tokens the two vocabularies share by bytes (what anyspec uses), how many
string matching would find instead (what vLLM's and HF's translators do, and how many of those
matches are false), and how much of a sample text the target writes with shared tokens.
"""

from __future__ import annotations

import time
import warnings
from importlib import resources
from typing import Any

import numpy as np

from anyspec.errors import ConfigError
from anyspec.vocab.bytes import TokenTable, token_strings
from anyspec.vocab.family import detect_family, detect_space_prefix
from anyspec.vocab.mapping import VocabMapping

GOOD_COVERAGE = 0.90
FAIR_COVERAGE = 0.70


def string_match(target_tokenizer: Any, draft_tokenizer: Any, target: TokenTable, draft: TokenTable,
                 target_vocab_size: int, draft_vocab_size: int) -> np.ndarray:
    """draft -> target ids as string matching finds them (−1 where it finds none).

    This follows HF's ``AssistantToTargetTranslator`` (vLLM's ``VocabMapping`` does the same):
    probe each tokenizer's space marker, and when both are known and differ, swap a *leading*
    draft marker for the target's; then look the string up in the target vocab. Special tokens
    are left out on both sides, as in the byte intersection.
    """
    draft_marker, target_marker = detect_space_prefix(draft_tokenizer), detect_space_prefix(target_tokenizer)
    swap = len(draft_marker) == 1 and len(target_marker) == 1 and draft_marker != target_marker
    old, new = (draft_marker[0], target_marker[0]) if swap else ("", "")
    lookup = {}
    for idx, s in enumerate(token_strings(target_tokenizer)[:target_vocab_size]):
        if s is not None and not target.special[idx]:
            lookup.setdefault(s, idx)
    out = np.full(draft_vocab_size, -1, dtype=np.int64)
    for idx, s in enumerate(token_strings(draft_tokenizer)[:draft_vocab_size]):
        if s is None or draft.special[idx]:
            continue
        if swap and s.startswith(old):
            s = new + s[len(old):]
        out[idx] = lookup.get(s, -1)
    return out


def analyze_pair(target_tokenizer: Any, draft_tokenizer: Any, text: str, text_name: str = "sample",
                 names: tuple[str, str] | None = None) -> dict:
    """Everything ``anyspec analyze`` prints, as a dict (see :func:`format_report`)."""
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*has no unk token.*")
        mapping = VocabMapping(target_tokenizer, draft_tokenizer, len(target_tokenizer), len(draft_tokenizer))
    build_s = time.perf_counter() - started
    target, draft = mapping.target_token_bytes, mapping.draft_token_bytes
    d2t = mapping.draft_to_target.cpu().numpy()
    t2d = mapping.target_to_draft.cpu().numpy()
    if mapping.intersection_size == 0:
        raise ConfigError("the two vocabularies share no token; TLI cannot work for this pair "
                          "(check the paths, or use a string-level method such as SLEM)")
    by_string = string_match(target_tokenizer, draft_tokenizer, target, draft, mapping.target_vocab_size,
                             mapping.draft_vocab_size)
    pairs = np.flatnonzero(by_string >= 0)
    false = sum(1 for d in pairs.tolist() if draft[d] != target[int(by_string[d])])
    byte_only = int(np.count_nonzero((d2t >= 0) & (by_string < 0)))
    ids = target_tokenizer.encode(text, add_special_tokens=False) if text else []
    ids = [i for i in ids if 0 <= i < len(t2d)]
    inside = sum(1 for i in ids if t2d[i] >= 0)
    coverage = inside / len(ids) if ids else 0.0
    return {
        "target": _side(target_tokenizer, target, t2d, mapping.target_eos_ids, names and names[0]),
        "draft": _side(draft_tokenizer, draft, d2t, mapping.draft_eos_ids, names and names[1]),
        "intersection": {
            "draft_tokens": mapping.intersection_size,
            "target_tokens": int(np.count_nonzero(t2d >= 0)),
            "distinct_byte_strings": int(np.count_nonzero(t2d[d2t[d2t >= 0]] == np.flatnonzero(d2t >= 0))),
            "build_seconds": round(build_s, 3),
            "from_cache": mapping.from_cache,
        },
        "string_matching": {
            "matches": int(len(pairs)),
            "false_matches": int(false),
            "correct_matches": int(len(pairs) - false),
            "missed_by_strings": byte_only,
        },
        "coverage": {
            "text": text_name,
            "target_tokens": len(ids),
            "in_intersection": inside,
            "share": round(coverage, 4),
        },
        "verdict": verdict(coverage, len(ids)),
    }


def _side(tokenizer: Any, table: TokenTable, to_other: np.ndarray, eos: tuple[int, ...],
          name: str | None) -> dict:
    family = detect_family(tokenizer)
    mapped = int(np.count_nonzero(to_other >= 0))
    return {
        "name": name or str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__),
        "family": family.kind + (" + byte fallback" if family.byte_fallback else ""),
        "vocab_size": len(table),
        "special_tokens": int(table.special.sum()),
        "eos_ids": list(eos),
        "in_intersection": mapped,
        "share_in_intersection": round(mapped / max(len(to_other), 1), 4),
    }


def verdict(coverage: float, n_tokens: int) -> str:
    if n_tokens == 0:
        return "no sample tokens to judge by; pass --text with some typical input"
    pct = f"{coverage:.0%} of the target's tokens on the sample are shared"
    if coverage >= GOOD_COVERAGE:
        return f"good fit for TLI: {pct}, so the draft can propose almost everything the target writes"
    if coverage >= FAIR_COVERAGE:
        return f"workable for TLI: {pct}; expect shorter accepted runs where the rest appear"
    return (f"poor fit for TLI: only {pct}; a string-level method (SLEM) or a draft from the "
            "target's family will do better")


_FAMILY_WORDS = {
    "byte-level": "byte-level BPE",
    "metaspace": "SentencePiece-style (\u2581 for spaces)",
    "metaspace + byte fallback": "SentencePiece-style (\u2581 for spaces, <0xNN> byte pieces)",
    "wordpiece": "WordPiece (## continuations)",
    "plain": "plain strings",
}


def format_report(report: dict) -> str:
    """The report as short paragraphs a newcomer can read."""
    t, d, i, s, c = (report[k] for k in ("target", "draft", "intersection", "string_matching", "coverage"))

    def side(label: str, x: dict) -> str:
        family = _FAMILY_WORDS.get(x["family"], x["family"])
        return (f"{label}  {x['name']}\n"
                f"        {family}, {x['vocab_size']:,} tokens ({x['special_tokens']:,} special)")

    duplicates = d["in_intersection"] - i["distinct_byte_strings"]
    lines = [
        side("Target", t),
        side("Draft ", d),
        "",
        "Shared vocabulary (tokens that stand for exactly the same bytes; special tokens never count)",
        f"  {i['distinct_byte_strings']:,} tokens are in both vocabularies: "
        f"{t['share_in_intersection']:.1%} of the target's, {d['share_in_intersection']:.1%} of the draft's",
    ]
    if duplicates:
        lines.append(f"  ({duplicates:,} more draft ids repeat the bytes of another draft token, "
                     "like <0x41> and A; they map too)")
    lines += [
        f"  built in {i['build_seconds']:.2f} s{' (from the cache)' if i['from_cache'] else ''}",
        "",
        "For comparison, string matching as vLLM and HF do it (swap a leading \u0120/\u2581, compare)",
        f"  finds {s['matches']:,} pairs, {s['false_matches']:,} of them FALSE (the two tokens stand for "
        f"different bytes), and misses {s['missed_by_strings']:,} true pairs",
        "",
        f"Coverage on {c['text']}",
        f"  {c['in_intersection']:,} of the {c['target_tokens']:,} tokens the target writes for it "
        f"({c['share']:.1%}) are shared, so the draft can propose them",
        "",
        f"Verdict: {report['verdict']}",
    ]
    return "\n".join(lines)


def default_sample() -> str:
    return resources.files("anyspec").joinpath("data/sample.txt").read_text(encoding="utf-8")
