"""Model backends: a model, its tokenizer and a KV cache driven by extend/crop."""
