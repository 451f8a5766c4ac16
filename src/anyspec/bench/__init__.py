"""``anyspec bench``: anyspec against the target alone and Hugging Face's assisted generation.

On the same loaded models, dtype and prompts it runs, per prompt and in an order that rotates from
prompt to prompt (so slow drift of the machine falls on every method alike):

- ``target``: the target alone, on anyspec's own loop (k = 0), greedy: the reference output;
- ``anyspec-greedy`` / ``anyspec-sampled``: TLI greedy, and sampled (``auto``: SLEM) against
  ``target-sampled``, the target alone with the same seed;
- ``anyspec-slem``: SLEM (string-level exact match), greedy;
- ``llama.cpp``: llama.cpp's ``llama-server`` on the target's GGUF file alone (``llama.py``);
  ``llama.cpp-ngram`` (opt-in): the same with llama.cpp's own lookup speculation, the server
  arguments of ``--llama-spec`` (``llama_spec.py``), its answers also compared with ``llama.cpp``'s;
- ``hf-target`` / ``hf-uag``: transformers ``generate`` alone and with ``assistant_model=`` +
  ``assistant_tokenizer=`` (Universal Assisted Generation), each against its own baseline;
- ``vllm``: vLLM's own speculative decoding with the same pair (``method="draft_model"``,
  ``use_heterogeneous_vocab=True``), greedy; ``vllm-target`` (opt-in): vLLM with the target alone
  (``vllm.py``: in this process, or in a subprocess of ``--vllm-python``).

Greedy outputs are compared token by token with ``target``; where they differ, the position and
the target's top-1 minus top-2 logit at that position are reported (a near-tie there means the
difference is numerical, not a bug). Writes JSON, a Markdown table and optionally a PNG plot.

The package, in reading order: ``run.py`` (the checks, the rotation, the comparison),
``context.py`` (what every method reads), ``methods.py`` (their names and baselines),
``prompts.py``, the other engines' methods (``hf.py``, ``llama.py`` with ``llama_spec.py``,
``vllm.py`` and the vLLM runner in ``isolated/``) and ``report.py`` (the summary, the table and
the plot).
"""
