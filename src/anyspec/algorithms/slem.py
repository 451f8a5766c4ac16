"""String-Level Exact Match (SLEM): the draft speaks freely; its TEXT is re-encoded for the target.

Timor et al., "Accelerating LLM Inference with Lossless Speculative Decoding Algorithms for
Heterogeneous Vocabularies" (ICML 2025). Unlike TLI, the draft is not confined to the tokens both
vocabularies share: whatever it writes is turned into target tokens through the text.

One round, for k draft tokens:

1. Propose: the draft picks k tokens from its FULL vocabulary, one cached forward each: the
   argmax, or for a sampled request its Gumbel-max choice coupled to the target's noise
   (``engine/sampler.py``).
2. ``draft_bytes`` + ``retokenize``: the tokens' bytes are joined (a special token such as EOS
   ends the draft's text) and an unfinished UTF-8 sequence at the end is dropped. The text is
   encoded with the TARGET tokenizer (no special tokens), plainly or behind an anchor that cuts a
   SentencePiece dummy prefix off (``spelling.encode_exact``), and kept only if the target ids
   spell exactly those bytes; else nothing is proposed this round (the target still emits one
   token). The proposal is capped at k target tokens, since the verify pass grows with it. A draft
   token the target lacks (SmolLM2's "\\n   " merge) becomes several target tokens ("\\n", "   "),
   and target tokens the draft lacks can be proposed, which TLI never can.
3. The target scores [pending token, t1..tm] in ONE forward pass: m+1 rows of logits. Verify by
   EXACT MATCH (``tli.verify_exact``): accept while t_i is the target's own choice x_i at its
   position, then commit x_i (or, when all m match, the bonus token x_m). x_i is the argmax, or
   for a sampled request the Gumbel-max choice with noise fixed by the seed and the position
   (``gumbel.py``).
4. The draft's context follows the committed text in its own tokenization, exactly as TLI with
   ``draft_context="retokenize"`` (``engine/context.py``).

Why this is lossless for ANY proposal: at step i every earlier t_j was accepted, so the context
the target scored is exactly the committed text, and the committed token is x_i, the target's
choice there from its logits and the noise of (seed, i). The committed answer is therefore the
target alone's with that seed, token for token, whatever was proposed; the proposal only decides
how many of those choices one forward pass gets to keep. With fresh noise per request, each
token is an exact sample of the target's distribution (the Gumbel-max trick), even though the
draft reads the same noise: the draft changes which rows are scored, never what a row commits.
"""

from __future__ import annotations

from anyspec.algorithms.spelling import encode_exact, incomplete_utf8_tail


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
