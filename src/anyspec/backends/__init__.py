"""Models that prefill, extend and crop a KV cache, and anyspec's CPU kernels."""
