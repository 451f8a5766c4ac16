"""The target and draft, loaded one way for every caller: the commands, the server, the bench and
``anyspec.generate``.

``check_pair`` finds what cannot work (a model that is not there, an unknown dtype, a thread count
below one or above the CPU count) and resolves the dtypes, before anything loads; ``load_pair``
then sets the threads and loads the target and, unless there is none, the draft.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from anyspec.config import (
    SamplingParams,
    SpeculativeConfig,
    check_alone,
    check_callbacks,
    check_prompt,
    given,
)
from anyspec.errors import ConfigError
from anyspec.models import DEFAULT_DRAFT, DEFAULT_TARGET

if TYPE_CHECKING:
    from anyspec.engine import Engine, GenerationResult


class PairPlan(NamedTuple):
    target: str
    draft: str | None  # None: the target alone
    dtype: str  # canonical names (bf16, fp16, fp32, int8), resolved once
    draft_dtype: str | None
    threads: int | None = None
    allow_download: bool = False
    trust_remote_code: bool = False
    chat_template: str | None = None  # the target's chat template in place of its own (read_template)
    kv_cache_dtype: str = "fp32"  # both models' KV caches: fp32 or fp16 (backends.load.KV_CACHE_DTYPES)
    max_model_len: int | None = None  # the target's context cut to this many tokens (None: its own)


class Pair(NamedTuple):
    target: object
    draft: object | None
    plan: PairPlan


def check_pair(target: str, draft: str | None, dtype: str | None = None, draft_dtype: str | None = None,
               threads: int | None = None, allow_download: bool = False,
               trust_remote_code: bool = False, chat_template: str | None = None,
               kv_cache_dtype: str = "fp32", max_model_len: int | None = None) -> PairPlan:
    """The pair to load, every option checked; ``chat_template``: a file, or a template's text;
    ``max_model_len``: the most tokens a prompt and its answer may hold together, at most the
    target's own context (checked against its file here where it is known, else once it loads)."""
    from anyspec.backends import load as backend

    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)):
        raise ConfigError(f"threads must be an integer (None: torch's choice), got {threads!r}")
    if threads is not None and threads < 1:
        raise ConfigError(f"threads must be >= 1, got {threads}", "threads")
    cpus = os.cpu_count() or 1
    if threads is not None and threads > cpus:
        raise ConfigError(f"threads must be at most this machine's {cpus} CPUs, got {threads}", "threads")
    target, draft = _spec(target, "target"), _spec(draft, "draft") if draft is not None else None
    resolved = backend.resolve_dtype(dtype, spec=target)
    if draft is None and draft_dtype not in (None, "auto"):
        raise ConfigError(f"draft_dtype {draft_dtype} is for a draft and there is none (--no-draft, "
                          "draft=None); leave it out", "draft_dtype")
    draft_resolved = backend.resolve_dtype(draft_dtype, draft=True, spec=draft) if draft else None
    for role, spec in (("target", target), ("draft", draft)):
        if spec is not None and not spec.strip():
            raise ConfigError(f"{role} is empty; give a model folder, a .gguf file or a built-in name", role)
    for spec in [target] + ([draft] if draft else []):
        backend.check_model_path(spec, allow_download)
    backend.check_kv_cache_dtype(kv_cache_dtype, resolved)
    if draft_resolved is not None:
        backend.check_kv_cache_dtype(kv_cache_dtype, draft_resolved)
    template = read_template(chat_template) if chat_template is not None else None
    if max_model_len is not None:
        if isinstance(max_model_len, bool) or not isinstance(max_model_len, int) or max_model_len < 2:
            raise ConfigError(f"max_model_len must be an integer >= 2 (a prompt token and an answer's), "
                              f"got {max_model_len!r}", "max_model_len")
        backend.check_context_cap(max_model_len, backend.known_context(target))
    return PairPlan(target, draft, resolved, draft_resolved, threads, allow_download, trust_remote_code,
                    template, kv_cache_dtype, max_model_len)


def plan_context(plan: PairPlan) -> int | None:
    """The target's context as the plan will load it: ``max_model_len``, else its file's (None where
    that is not known before it loads)."""
    from anyspec.backends.load import known_context

    return plan.max_model_len or known_context(plan.target)


def check_new_tokens(plan: PairPlan, max_new_tokens: int, option: str = "--max-new-tokens") -> None:
    """Refuse, before the models load, more new tokens than the target's context holds beside a
    prompt (known from its file; a built-in model not fetched yet is checked once it loads)."""
    context = plan_context(plan)
    if context is not None and max_new_tokens >= context:
        raise ConfigError(f"{option} {max_new_tokens} leaves no room for a prompt in the target's context "
                          f"of {context} tokens; ask for fewer")


def read_template(source: str) -> str:
    """A chat template's Jinja text from a file, or given as text (as vLLM's ``--chat-template``),
    parsed as transformers will render it."""
    path = Path(source).expanduser()
    if path.is_file():
        try:
            text = path.read_text(encoding="utf-8-sig")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"chat_template {source} is not valid UTF-8 text ({exc.reason} at byte "
                              f"{exc.start})", "chat_template") from None
        except (OSError, ValueError) as exc:
            raise ConfigError(f"chat_template {source} cannot be read: {exc}", "chat_template") from None
    elif "{{" in source or "{%" in source:
        text = source
    else:
        raise ConfigError(f"chat_template {source} is neither a file nor a template's text", "chat_template")
    from jinja2 import TemplateSyntaxError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    try:
        ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"]).parse(text)
    except TemplateSyntaxError as exc:
        raise ConfigError(f"chat_template does not parse: {exc.message} (line {exc.lineno})",
                          "chat_template") from None
    return text


def load_pair(plan: PairPlan, names: tuple[str, str] = ("target", "draft")) -> Pair:
    """The pair, loaded with Python's cyclic garbage collector paused: loading creates millions of
    long-lived objects (vocabularies, their byte tables), and each full collection on the way would
    walk all of them again. The GGUF readers the checks and the loading shared are dropped after
    it: each keeps its whole file's memory map, which would outlive the models."""
    import torch

    from anyspec.backends import load as backend
    from anyspec.backends.gguf_file import forget_readers

    if plan.threads is not None:
        torch.set_num_threads(plan.threads)
    options = dict(allow_download=plan.allow_download, trust_remote_code=plan.trust_remote_code,
                   kv_cache_dtype=plan.kv_cache_dtype)
    collecting = gc.isenabled()
    gc.disable()
    try:
        target = backend.load_model(plan.target, dtype=plan.dtype, name=names[0], **options)
        if plan.max_model_len is not None:
            backend.check_context_cap(plan.max_model_len, target.context_length)
            target.context_length = plan.max_model_len
        if plan.chat_template is not None:
            target.tokenizer.chat_template = plan.chat_template
        draft = None
        if plan.draft:
            draft = backend.load_model(plan.draft, dtype=plan.draft_dtype, name=names[1], **options)
    finally:
        forget_readers()
        if collecting:
            gc.enable()
    return Pair(target, draft, plan)


def _spec(value, what: str) -> str:
    """A model given as a built-in name, a folder or a .gguf file: a string or a path."""
    if not isinstance(value, str | os.PathLike):
        raise ConfigError(f"{what} must be a built-in model name, a folder or a .gguf file, got "
                          f"{type(value).__name__}")
    return os.fspath(value)


def load(target: str | os.PathLike = DEFAULT_TARGET, draft: str | os.PathLike | None = DEFAULT_DRAFT,
         config: SpeculativeConfig | None = None, dtype: str | None = None, draft_dtype: str | None = None,
         threads: int | None = None, chat_template: str | None = None,
         kv_cache_dtype: str = "fp32", max_model_len: int | None = None) -> Engine:
    """An ``Engine`` over the two models (built-in names, folders or GGUF files; ``draft=None``: the
    target alone), every option checked before anything loads. ``dtype``/``draft_dtype``: each
    model's weights (None: its file's, or the kernels' default); ``threads``: torch's thread count,
    for the whole process; ``chat_template``: a Jinja file or text in place of the target's own;
    ``kv_cache_dtype``: ``"fp32"`` or ``"fp16"`` (half the cache's memory); ``max_model_len``: the
    most tokens a prompt and its answer hold together (None: the target's own context), which
    bounds each KV cache."""
    return _engine(*_checked(target, draft, config, dtype, draft_dtype, threads, chat_template,
                             kv_cache_dtype, max_model_len))


def generate(prompt: str | list[dict], target: str | os.PathLike = DEFAULT_TARGET,
             draft: str | os.PathLike | None = DEFAULT_DRAFT, config: SpeculativeConfig | None = None,
             params: SamplingParams | None = None, dtype: str | None = None,
             on_text: Callable[[str], None] | None = None, draft_dtype: str | None = None,
             threads: int | None = None, chat_template: str | None = None,
             kv_cache_dtype: str = "fp32", max_model_len: int | None = None) -> GenerationResult:
    """One call: load the models (as ``load`` does), generate, and free the models again
    (``Engine.close``); ``on_text`` receives the text as it is committed."""
    params = given(params, SamplingParams, "params")
    check_prompt(prompt)
    check_callbacks(on_text)
    config, plan = _checked(target, draft, config, dtype, draft_dtype, threads, chat_template, kv_cache_dtype,
                            max_model_len)
    check_new_tokens(plan, params.max_new_tokens, "max_new_tokens")
    with _engine(config, plan) as engine:
        return engine.generate(prompt, params, on_text=on_text)


def _checked(target, draft, config, dtype, draft_dtype, threads, chat_template,
             kv_cache_dtype, max_model_len) -> tuple[SpeculativeConfig, PairPlan]:
    """``load``'s options checked, the config first: the config and the pair to load."""
    config = given(config, SpeculativeConfig, "config")
    if draft is None:
        check_alone(config)
    return config, check_pair(target, draft, dtype, draft_dtype, threads, chat_template=chat_template,
                              kv_cache_dtype=kv_cache_dtype, max_model_len=max_model_len)


def _engine(config: SpeculativeConfig, plan: PairPlan) -> Engine:
    from anyspec.engine import Engine

    pair = load_pair(plan)
    return Engine(pair.target, pair.draft, config)
