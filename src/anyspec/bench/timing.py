"""Each bench run's time to the first token, prefill and decode, measured apart, and their summary.

A run's row may carry ``ttft`` (seconds from the start of its generation to its first token),
``prefill_tokens``/``prefill_seconds`` (the prompt tokens computed into the cache, and how long they
took) and ``decode_tokens``/``decode_seconds`` (the tokens after the first commit, and the time
after it). A method that cannot measure them honestly leaves them out; the summary then says None.
"""

from __future__ import annotations

TIMING_KEYS = ("ttft", "prefill_tokens", "prefill_seconds", "decode_tokens", "decode_seconds")


def engine_timings(stats) -> dict:
    """An anyspec generation's, from its ``Stats``: the prefill is the prompt but its last token, which
    the first round's verify reads; the first commit can hold several tokens, so decode counts from
    after it."""
    first = stats.first_tokens > 0
    return {"ttft": stats.first_token_seconds if first else None,
            "prefill_tokens": max(0, stats.prompt_tokens - stats.prompt_cached - 1),
            "prefill_seconds": stats.prefill_seconds,
            "decode_tokens": stats.generated - stats.first_tokens if first else None,
            "decode_seconds": stats.total_seconds - stats.first_token_seconds if first else None,
            "prompt_tokens": stats.prompt_tokens, "prompt_cached": stats.prompt_cached}


def llama_timings(result: dict) -> dict:
    """llama-server's own ``timings``: ``prompt_ms`` ends when the first token is sampled, and
    ``predicted_ms`` runs from there over ``predicted_n`` tokens, the first included."""
    if any(result.get(k) is None for k in ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms")):
        return {}
    return {"ttft": result["prompt_ms"] / 1000, "prefill_tokens": result["prompt_n"],
            "prefill_seconds": result["prompt_ms"] / 1000,
            "decode_tokens": max(0, result["predicted_n"] - 1),
            "decode_seconds": result["predicted_ms"] / 1000}


def _rate(runs: list[dict], tokens: str, seconds: str) -> float | None:
    timed = [r for r in runs if r.get(tokens) is not None and r.get(seconds) is not None]
    total = sum(r[seconds] for r in timed)
    return round(sum(r[tokens] for r in timed) / total, 2) if timed and total > 0 else None


def _mean_ms(runs: list[dict]) -> float | None:
    timed = [r["ttft"] for r in runs if r.get("ttft") is not None]
    return round(1000 * sum(timed) / len(timed), 1) if timed else None


def timing_summary(runs: list[dict]) -> dict:
    """The runs' mean time to the first token (ms), prefill and decode tokens/s (pooled: all tokens
    over all seconds); for conversations, the first turns' and the later turns' mean apart."""
    out = {"ttft_ms": _mean_ms(runs),
           "prefill_tokens_per_second": _rate(runs, "prefill_tokens", "prefill_seconds"),
           "decode_tokens_per_second": _rate(runs, "decode_tokens", "decode_seconds")}
    turns = [r for r in runs if r.get("turn")]
    if turns:
        out["ttft_ms_first_turn"] = _mean_ms([r for r in turns if r["turn"] == 1])
        out["ttft_ms_later_turns"] = _mean_ms([r for r in turns if r["turn"] > 1])
    return out
