"""vLLM plugin: vLLM's draft-model proposer uses anyspec's byte-exact vocabulary mapping.

vLLM calls :func:`register` (entry point ``anyspec_vocab`` in the ``vllm.general_plugins`` group)
in every process it starts. It replaces ``VocabMapping`` of ``vllm.v1.spec_decode.vocab_mapping``,
the class ``DraftModelProposer`` builds when ``speculative_config`` has
``use_heterogeneous_vocab=True``, with :class:`AnyspecVocabMapping`: the same constructor,
attributes and methods, over :class:`anyspec.vocab.VocabMapping`. Nothing else changes.

``ANYSPEC_VLLM_PLUGIN=0`` turns the plugin off. On a vLLM version outside
:data:`SUPPORTED_VLLM_VERSIONS`, or where the patched class is missing or has another shape,
:func:`register` raises, and vLLM stops with that error.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

import torch

SUPPORTED_VLLM_VERSIONS = ("0.32.0",)
ENV_SWITCH = "ANYSPEC_VLLM_PLUGIN"
VOCAB_MAPPING_MODULE = "vllm.v1.spec_decode.vocab_mapping"
PROPOSER_MODULE = "vllm.v1.spec_decode.draft_model"
CONSTRUCTOR_PARAMETERS = ("target_tokenizer", "draft_tokenizer", "target_vocab_size", "draft_vocab_size",
                          "device")
METHODS = ("map_target_to_draft_ids", "map_draft_to_target_ids", "constrain_draft_logits")
ACTIVE_MESSAGE = "anyspec byte-exact vocab mapping active"

# A child of vLLM's "vllm" logger, so vLLM's handler prints it in every process.
logger = logging.getLogger("vllm.anyspec")


class AnyspecVocabMapping:
    """vLLM 0.32's ``VocabMapping`` interface over :class:`anyspec.vocab.VocabMapping`.

    Ordinary tokens pair up when they stand for the same bytes, instead of vLLM's match of
    space-normalised token strings. Special tokens have no bytes; as in vLLM, one pairs with the
    other side's special token of the same name (``<|im_start|>`` with ``<|im_start|>``), so the
    draft reads a chat template's markers as its own. As in vLLM: ``draft_to_target_ids`` and
    ``target_to_draft_ids`` are long tensors on ``device`` with −1 outside the intersection,
    ``intersection_mask_draft`` is a bool tensor over the draft vocab, and the ``map_*`` methods
    send ids outside the intersection to the other side's UNK id (unk, else eos) and return the
    dtype they were given.
    """

    def __init__(self, target_tokenizer: Any, draft_tokenizer: Any, target_vocab_size: int,
                 draft_vocab_size: int, device: str | torch.device):
        from anyspec.vocab.mapping import VocabMapping

        self.anyspec = VocabMapping(target_tokenizer, draft_tokenizer, target_vocab_size, draft_vocab_size,
                                    device)
        self.target_vocab_size = target_vocab_size
        self.draft_vocab_size = draft_vocab_size
        self.device = device
        self.target_unk_token_id = self.anyspec.target_unk_id
        self.draft_unk_token_id = self.anyspec.draft_unk_id
        draft_to_target = self.anyspec.draft_to_target.clone()
        target_to_draft = self.anyspec.target_to_draft.clone()
        self.special_pairs = special_pairs(target_tokenizer, draft_tokenizer, target_vocab_size,
                                           draft_vocab_size)
        for draft_id, target_id in self.special_pairs:
            draft_to_target[draft_id] = target_id
            target_to_draft[target_id] = draft_id
        self.draft_to_target_ids = draft_to_target
        self.target_to_draft_ids = target_to_draft
        self.intersection_mask_draft = draft_to_target >= 0
        self.intersection_size = int(self.intersection_mask_draft.sum().item())
        self._outside = {self.intersection_mask_draft.device: ~self.intersection_mask_draft}
        self._draft_to_target_or_unk = _fill(draft_to_target, self.target_unk_token_id)
        self._target_to_draft_or_unk = _fill(target_to_draft, self.draft_unk_token_id)
        logger.info("%s: intersection=%d (%.1f%% of draft, %.1f%% of target; %d special tokens paired by "
                    "name), target_vocab=%d, draft_vocab=%d", ACTIVE_MESSAGE, self.intersection_size,
                    100.0 * self.intersection_size / max(draft_vocab_size, 1),
                    100.0 * self.intersection_size / max(target_vocab_size, 1), len(self.special_pairs),
                    target_vocab_size, draft_vocab_size)
        if self.intersection_size < 100:
            logger.warning("Very small vocabulary intersection (%d tokens).", self.intersection_size)

    def map_target_to_draft_ids(self, target_ids: torch.Tensor) -> torch.Tensor:
        return self._target_to_draft_or_unk[target_ids].to(target_ids.dtype)

    def map_draft_to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return self._draft_to_target_or_unk[draft_ids].to(draft_ids.dtype)

    def constrain_draft_logits(self, logits: torch.Tensor) -> torch.Tensor:
        from anyspec.vocab.mapping import mask_outside

        return mask_outside(logits, self._outside, self.draft_vocab_size)


def special_pairs(target_tokenizer: Any, draft_tokenizer: Any, target_vocab_size: int,
                  draft_vocab_size: int) -> list[tuple[int, int]]:
    """``(draft_id, target_id)`` for each special token name both sides have (ids below the vocab sizes)."""
    target = _specials_by_name(target_tokenizer, target_vocab_size)
    draft = _specials_by_name(draft_tokenizer, draft_vocab_size)
    return [(draft[name], target[name]) for name in sorted(draft.keys() & target.keys())]


def _specials_by_name(tokenizer: Any, vocab_size: int) -> dict[str, int]:
    from anyspec.vocab.bytes import special_ids

    ids = [int(i) for i in special_ids(tokenizer, vocab_size).nonzero()[0]]
    names: dict[str, int] = {}
    for token_id, name in zip(ids, tokenizer.convert_ids_to_tokens(ids), strict=True):
        if isinstance(name, str) and name:
            names.setdefault(name, token_id)
    return names


def _fill(table: torch.Tensor, unk: int) -> torch.Tensor:
    return torch.where(table >= 0, table, torch.full_like(table, unk))


def enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether ``ANYSPEC_VLLM_PLUGIN`` leaves the plugin on (unset, 1/true/on/yes) or off (0/false/off/no)."""
    value = environ.get(ENV_SWITCH, "1").strip().lower()
    if value in ("1", "true", "on", "yes", ""):
        return True
    if value in ("0", "false", "off", "no"):
        return False
    raise ValueError(f"{ENV_SWITCH}={environ[ENV_SWITCH]!r}: use 1 (on, the default) or 0 (off)")


def check_version(version: str) -> None:
    """Raise unless ``version`` (a local suffix such as ``+cpu`` aside) is a supported vLLM."""
    if version.split("+", 1)[0] not in SUPPORTED_VLLM_VERSIONS:
        raise RuntimeError(
            f"anyspec's vLLM plugin supports vLLM {', '.join(SUPPORTED_VLLM_VERSIONS)}, not {version}: "
            f"install one (pip install 'anyspec[vllm]') or turn the plugin off with {ENV_SWITCH}=0")


def _moved(what: str) -> RuntimeError:
    return RuntimeError(
        f"anyspec's vLLM plugin: {what}. vLLM's internals differ from vLLM "
        f"{', '.join(SUPPORTED_VLLM_VERSIONS)}; turn the plugin off with {ENV_SWITCH}=0")


def _check_target(cls: Any, where: str) -> None:
    if cls is AnyspecVocabMapping:
        return
    if not inspect.isclass(cls):
        raise _moved(f"{where}.VocabMapping is missing")
    missing = [name for name in METHODS if not callable(getattr(cls, name, None))]
    if missing:
        raise _moved(f"{where}.VocabMapping has no {', '.join(missing)}")
    parameters = tuple(inspect.signature(cls.__init__).parameters)[1:]
    if parameters != CONSTRUCTOR_PARAMETERS:
        raise _moved(f"{where}.VocabMapping takes ({', '.join(parameters)}), "
                     f"expected ({', '.join(CONSTRUCTOR_PARAMETERS)})")


def _import(name: str):
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise _moved(f"cannot import {name} ({exc})") from exc


def register() -> None:
    """vLLM's plugin hook: use :class:`AnyspecVocabMapping` for heterogeneous-vocabulary drafting.

    Safe to call more than once. The proposer module imports ``VocabMapping`` by name, so it is
    patched too when it is already imported, and picks up the patched class when it is not.
    """
    if not enabled():
        logger.info("anyspec vocab mapping plugin off (%s=0); vLLM's own VocabMapping stays", ENV_SWITCH)
        return
    vllm = _import("vllm")
    check_version(str(getattr(vllm, "__version__", "unknown")))
    module = _import(VOCAB_MAPPING_MODULE)
    _check_target(getattr(module, "VocabMapping", None), VOCAB_MAPPING_MODULE)
    proposer = sys.modules.get(PROPOSER_MODULE)
    if proposer is not None:
        _check_target(getattr(proposer, "VocabMapping", None), PROPOSER_MODULE)
    else:
        try:
            spec = importlib.util.find_spec(PROPOSER_MODULE)
        except (ImportError, ValueError) as exc:
            raise _moved(f"cannot find {PROPOSER_MODULE} ({exc})") from exc
        if spec is None:
            raise _moved(f"{PROPOSER_MODULE} does not exist")
    module.VocabMapping = AnyspecVocabMapping
    if proposer is not None:
        proposer.VocabMapping = AnyspecVocabMapping
    logger.debug("anyspec vocab mapping plugin registered for vLLM %s", vllm.__version__)
