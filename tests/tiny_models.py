"""Tiny random-weight causal LMs with real tokenizers, saved to a folder so anything loads them by path.

``save_tiny_model(tokenizer, folder)`` writes a 2-layer, hidden-32 model whose vocabulary is the
tokenizer's; the weights come from a fixed seed, so two calls give the same model.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Import into a test module: tiny models run faster on one torch thread (thread hand-offs cost
    more than the work on a busy 2-core machine)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def save_tiny_model(tokenizer, folder: Path, arch: str = "llama", seed: int = 0,
                    max_positions: int = 256, chat_template: str | None = None) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    config_class = {"llama": LlamaConfig, "qwen2": Qwen2Config}[arch]
    config = config_class(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          max_position_embeddings=max_positions,
                          bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                          tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    folder = Path(folder)
    model.save_pretrained(folder)
    if chat_template is not None and not getattr(tokenizer, "chat_template", None):
        tokenizer = copy.deepcopy(tokenizer)  # the caller's may be a shared fixture
        tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(folder)
    return folder


def record_inputs(model) -> list[list[int]]:
    """Patch ``model.extend`` to log every id list the engine feeds it (undo with ``del model.extend``)."""
    calls: list[list[int]] = []
    original = model.extend

    def logged(ids, last=None):
        calls.append(list(ids))
        return original(ids, last)

    model.extend = logged
    return calls
