"""The engine, in reading order: ``loop.py`` (propose → verify → accept → commit), ``verify.py``
(the target's prefill and verify), ``batch.py`` (many generations' forwards in one pass),
``proposers.py`` (TLI and SLEM), ``bridge.py`` (ids and bytes across the two vocabularies),
``context.py`` (what the draft reads), ``output.py`` (UTF-8 streaming and stop strings),
``prompt.py`` (prompt → ids), ``grammar_text.py`` (a JSON schema, guide or tool list as grammar
text) and ``grammar.py`` (that grammar's masks on every verified row).
"""

from anyspec.config import SamplingParams, SpeculativeConfig
from anyspec.engine.loop import Engine, GenerationResult, Stats, speculative_generate
from anyspec.engine.prompt import encode_prompt, render_prompt
from anyspec.engine.proposers import algorithm_for

__all__ = ["Engine", "GenerationResult", "SamplingParams", "SpeculativeConfig", "Stats", "algorithm_for",
           "encode_prompt", "render_prompt", "speculative_generate"]
