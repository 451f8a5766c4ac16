"""String-Level Exact Match (SLEM): the draft speaks freely; its TEXT is re-encoded for the target.

Timor et al., "Accelerating LLM Inference with Lossless Speculative Decoding Algorithms for
Heterogeneous Vocabularies" (ICML 2025). Unlike TLI, the draft is not confined to the tokens both
vocabularies share: whatever it writes is turned into target tokens through the text.

One round, for k draft tokens:

1. ``propose``: the draft picks k tokens from its FULL vocabulary, one cached forward each: the
   argmax when greedy, else a sample from its distribution shaped by the same temperature / top-k
   / top-p as the target (``sampling.logits_to_probs``).
2. ``draft_bytes`` + ``retokenize``: the tokens' bytes are joined (a special token such as EOS
   ends the draft's text) and an unfinished UTF-8 sequence at the end is dropped. The text is
   encoded with the TARGET tokenizer (no special tokens), plainly or behind an anchor that cuts a
   SentencePiece dummy prefix off (``spelling.encode_exact``), and kept only if the target ids
   spell exactly those bytes; else nothing is proposed this round (the target still emits one
   token). The proposal is capped at k target tokens, since the verify pass grows with it. A draft
   token the target lacks (SmolLM2's "\\n   " merge) becomes several target tokens ("\\n", "   "),
   and target tokens the draft lacks can be proposed, which TLI never can.
3. The target scores [pending token, t1..tm] in ONE forward pass: m+1 distributions p_0..p_m.
   Verify by EXACT MATCH. Greedy: accept while t_i == argmax p_i, then emit the argmax
   (``tli.verify_greedy``). Sampling: draw x_i ~ p_i; accept t_i iff x_i == t_i; at the first
   mismatch emit x_i; if all m match, draw a bonus token from p_m. The engine draws x_i by
   Gumbel-max with noise fixed by the seed and the position (``gumbel.py``), so x_i is the token
   the target alone would draw; ``tli.verify_sample(p, one_hot(proposed), proposed)`` is the same
   rule with fresh draws (see below).
4. The draft's context follows the committed text in its own tokenization, exactly as TLI with
   ``draft_context="retokenize"`` (``engine/context.py``).

Why sampling is lossless for ANY proposal: at step i every earlier t_j was accepted, so the
context the target scored is exactly the committed text, and the committed token is x_i, a fresh
draw from p_i whether it matched or not. Each committed token is therefore distributed as the
target alone would sample it; the proposal only decides how many of those draws one forward pass
gets to keep. Equivalently, it is speculative sampling (Leviathan et al. 2023) with q = the
one-hot row on t_i, which IS the proposal's distribution once the draft's own random choices are
fixed (they are independent of the verifier's draws): accept with min(1, p(t_i) / 1) = p(t_i),
and on rejection draw from norm(max(0, p - onehot(t_i))) = p without t_i, renormalised, i.e. the
law of x_i given x_i != t_i. ``verify_sample`` is implemented as exactly that call,
``tli.verify_sample(p, one_hot(...))``.
"""

from __future__ import annotations

import torch

from anyspec.algorithms.sampling import argmax, logits_to_probs, sample
from anyspec.algorithms.spelling import encode_exact, incomplete_utf8_tail


def propose(draft_logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0,
            generator: torch.Generator | None = None) -> int:
    """One draft token from ``draft_logits [Vd]``, over the whole draft vocabulary."""
    if temperature == 0:
        return argmax(draft_logits)[0]
    return sample(logits_to_probs(draft_logits, temperature, top_k, top_p), generator)


def draft_bytes(draft_ids: list[int], token_bytes: list[bytes]) -> bytes:
    """The draft tokens' text as bytes, up to the first token without bytes (EOS, a special token)."""
    out = bytearray()
    for d in draft_ids:
        if not token_bytes[d]:
            break
        out += token_bytes[d]
    return bytes(out)


def retokenize(data: bytes, tokenizer, token_bytes: list[bytes], anchor_ids: list[int],
               limit: int) -> list[int]:
    """At most ``limit`` target ids spelling a prefix of ``data``; [] when nothing round-trips.

    An unfinished UTF-8 sequence at the end is dropped; the rest is encoded with the target
    ``tokenizer`` (``token_bytes`` its bytes table, ``anchor_ids`` its encoding of
    ``spelling.ANCHOR``) and must reproduce those bytes exactly.
    """
    data = data[: len(data) - incomplete_utf8_tail(data)]
    if not data or limit <= 0:
        return []
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:  # invalid bytes (e.g. a byte token out of place): no text to encode
        return []
    ids = encode_exact(tokenizer, text, data, token_bytes, anchor_ids)
    return [] if ids is None else ids[:limit]


def one_hot(target_ids: list[int], vocab_size: int) -> torch.Tensor:
    """``[m, Vt]`` rows with a 1 on each proposed token: the q of an exact-match proposal."""
    q = torch.zeros(len(target_ids), vocab_size)
    if target_ids:
        q[torch.arange(len(target_ids)), torch.tensor(target_ids)] = 1.0
    return q

