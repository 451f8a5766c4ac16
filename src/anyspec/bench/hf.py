"""The bench's ``hf-target`` and ``hf-uag`` methods: transformers' own ``generate``, alone and with
Universal Assisted Generation (``assistant_model=`` and ``assistant_tokenizer=``), on the same
prompts as anyspec's methods."""

from __future__ import annotations

import time

from anyspec.bench.context import BenchContext
from anyspec.engine.prompt import encode_prompt


def hf_models(ctx: BenchContext, assisted: bool):
    """transformers' own models for the hf methods: the pair's, or (GGUF-native pair) bf16 copies."""
    from anyspec.backends.load import load_model

    if ctx.hf_target is None:
        if hasattr(ctx.target, "model"):
            ctx.hf_target = ctx.target
        else:
            ctx.hf_target = load_model(ctx.target_spec, dtype="bf16", name="hf-target")
    if assisted and ctx.hf_draft is None:
        if hasattr(ctx.draft, "model"):
            ctx.hf_draft = ctx.draft
        else:
            ctx.hf_draft = load_model(ctx.draft_spec, dtype="bf16", name="hf-draft")
    return ctx.hf_target, ctx.hf_draft


def run_hf(ctx: BenchContext, prompt, assisted: bool) -> dict:
    import torch

    target_model, draft_model = hf_models(ctx, assisted)
    target, tok = target_model.model, target_model.tokenizer
    ids = torch.tensor([encode_prompt(tok, prompt)[0]])  # as the engine builds them
    kw = {"max_new_tokens": ctx.max_new_tokens, "do_sample": False, "attention_mask": torch.ones_like(ids),
          "top_p": None, "top_k": None, "temperature": None}
    if tok.pad_token_id is not None:
        kw["pad_token_id"] = tok.pad_token_id
    if assisted:
        kw.update(assistant_model=draft_model.model, tokenizer=tok, assistant_tokenizer=draft_model.tokenizer)
        if ctx.hf_assistant == "k":  # the same fixed k as anyspec instead of HF's adaptive default
            gc = draft_model.model.generation_config
            gc.num_assistant_tokens, gc.num_assistant_tokens_schedule = ctx.k, "constant"
            gc.assistant_confidence_threshold = 0.0
    t = time.perf_counter()
    with torch.inference_mode():
        out = target.generate(ids, **kw)
    dt = time.perf_counter() - t
    new = out[0, ids.shape[1]:].tolist()
    eos = ctx.eos
    for i, token in enumerate(new):
        if token in eos:
            new = new[:i]
            break
    return {"ids": new, "text": tok.decode(new), "seconds": dt, "drafted": None, "accepted": None}
