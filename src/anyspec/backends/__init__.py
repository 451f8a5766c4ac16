"""Models that prefill, extend and crop a KV cache, and anyspec's CPU kernels."""

from __future__ import annotations


def decode_cost(spec: str, n_gen: int = 64, threads: int | None = None) -> float:
    """Milliseconds per token of ``n_gen`` tokens decoded one at a time after a one-token prompt, as
    llama.cpp's ``llama-bench -n`` measures it (the model on anyspec's GGUF kernels)."""
    import time

    import torch

    from anyspec.backends.load import load_model

    if threads:
        torch.set_num_threads(threads)
    model = load_model(spec, dtype="gguf", name="target")
    token = int(model.extend([1000])[-1].argmax())
    start = time.perf_counter()
    for _ in range(n_gen):
        token = int(model.extend([token])[-1].argmax())
    model.reset()
    return 1000 * (time.perf_counter() - start) / n_gen


def forward_cost(spec: str, rows, repeats: int = 3, threads: int | None = None,
                 cache_len: int = 0) -> dict[int, float]:
    """Milliseconds of one forward of N rows on a cache of ``cache_len`` tokens, for each N in ``rows``.

    The model is ``spec`` on anyspec's GGUF kernels (a built-in name or a .gguf file); each figure is
    the median of ``repeats`` forwards. A forward of N rows is what verifying N - 1 draft tokens costs.
    """
    import statistics
    import time

    import torch

    from anyspec.backends.load import load_model

    if threads:
        torch.set_num_threads(threads)
    model = load_model(spec, dtype="gguf", name="target")
    ids = [int(i) for i in torch.randint(100, min(model.vocab_size, 20000), (cache_len + max(rows),),
                                         generator=torch.Generator().manual_seed(0))]
    model.extend(ids[:max(1, cache_len)])  # page the weights in
    out = {}
    for n in rows:
        times = []
        for _ in range(repeats):
            model.reset()
            if cache_len:
                model.extend(ids[:cache_len], last=1)
            start = time.perf_counter()
            model.extend(ids[cache_len:cache_len + n])
            times.append(time.perf_counter() - start)
        out[n] = 1000 * statistics.median(times)
    model.reset()
    return out
