"""The vocabulary bridge as the engine uses it: draft ids to target ids and back, the shared tokens,
and the bytes each token id adds to the text.

Byte tables are built on the vocabulary's token table, so the engine and the intersection agree on
what a token's bytes are. Special tokens (BOS, EOS, chat markers) add no text: b"". Padded embedding
rows past the tokenizer's end add none either.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from anyspec.algorithms import tli
from anyspec.config import SpeculativeConfig
from anyspec.errors import ConfigError


def text_bytes_table(table, vocab_size: int) -> list[bytes]:
    """``out[id]`` for a ``TokenTable``: its bytes, b"" for special, absent and padded ids."""
    special = table.special.tolist()
    present = table.present.tolist()
    out = [b"" if s or not ok else p for p, s, ok in zip(table.pieces, special, present, strict=True)]
    return out[:vocab_size] + [b""] * (vocab_size - len(out))


def token_bytes_table(tokenizer, vocab_size: int) -> list[bytes]:
    from anyspec.vocab import token_table

    return text_bytes_table(token_table(tokenizer), vocab_size)


@dataclass
class Bridge:
    draft_to_target: list[int]  # -1: no target token with the same bytes
    target_to_draft: list[int]
    intersection_mask: torch.Tensor | None  # draft ids that have a target twin; None: one vocabulary
    inter_draft_ids: torch.Tensor
    inter_target_ids: torch.Tensor
    draft_bytes: list[bytes]
    target_bytes: list[bytes] | None  # None: not needed (one vocabulary, TLI only)
    unk_id: int  # the draft id a target token without a twin reads as (token-map context)


def build_bridge(draft, target, config: SpeculativeConfig) -> Bridge:
    """With ``use_heterogeneous_vocab`` the bridge is the ``VocabMapping`` intersection; without it
    the vocabularies must be the same size and ids pass through unchanged."""
    if config.use_heterogeneous_vocab:
        from anyspec.vocab import VocabMapping

        with warnings.catch_warnings():  # the engine never maps target ids to a target UNK
            warnings.filterwarnings("ignore", message="the target tokenizer has no unk token")
            mapping = VocabMapping(target.tokenizer, draft.tokenizer, target.vocab_size, draft.vocab_size,
                                   "cpu")
        if mapping.intersection_size == 0:
            raise ConfigError("the draft and target vocabularies share no token; choose another draft")
        mask = mapping.intersection_mask.to(torch.bool)
        draft_to_target = mapping.draft_to_target.to(torch.long)
        target_to_draft = mapping.target_to_draft.to(torch.long)
        draft_bytes = text_bytes_table(mapping.draft_token_bytes, draft.vocab_size)
        target_bytes = text_bytes_table(mapping.target_token_bytes, target.vocab_size)
        unk_id = mapping.draft_unk_id
    else:
        if draft.vocab_size != target.vocab_size:
            raise ConfigError(
                f"the draft's vocabulary ({draft.vocab_size} ids) differs from the target's "
                f"({target.vocab_size}); leave out --same-vocab (use_heterogeneous_vocab=True) to draft "
                "across vocabularies")
        mask = None
        draft_to_target = target_to_draft = torch.arange(target.vocab_size)
        slem_tables = config.algorithm != "tli"  # auto runs SLEM for greedy requests
        draft_bytes = token_bytes_table(draft.tokenizer, draft.vocab_size) if slem_tables else []
        target_bytes = token_bytes_table(target.tokenizer, target.vocab_size) if slem_tables else None
        unk_id = 0
    inter_draft_ids, inter_target_ids = tli.intersection_ids(draft_to_target, mask)
    return Bridge(draft_to_target.tolist(), target_to_draft.tolist(), mask, inter_draft_ids, inter_target_ids,
                  draft_bytes, target_bytes, unk_id)
