"""The bench's methods by name, and what each one's speedup is measured against."""

METHODS = ("target", "target-sampled", "target-ngram", "target-predicted", "anyspec-greedy", "anyspec-slem",
           "anyspec-slem-ngram", "anyspec-slem-predicted", "anyspec-slem-chain", "anyspec-sampled",
           "llama.cpp", "llama.cpp-ngram", "hf-target", "hf-uag", "vllm-target", "vllm")
PREDICTED = ("target-predicted", "anyspec-slem-predicted")  # each prompt's prediction given (the edit set's)
# opt-in: a second vLLM instance (memory), the prompt-lookup variants (llama.cpp's too), the predicted
# ones and SLEM without branches
DEFAULT_METHODS = [m for m in METHODS if m not in ("vllm-target", "target-ngram", "anyspec-slem-ngram",
                                                   "anyspec-slem-chain", "llama.cpp-ngram", *PREDICTED)]
BASELINE = {"anyspec-greedy": "target", "anyspec-slem": "target", "anyspec-sampled": "target-sampled",
            "target-sampled": "target",
            "anyspec-slem-chain": "target",
            "target-ngram": "target", "anyspec-slem-ngram": "target",
            "target-predicted": "target", "anyspec-slem-predicted": "target",
            "hf-uag": "hf-target", "hf-target": "target", "vllm-target": "target", "vllm": "target",
            "llama.cpp": "target", "llama.cpp-ngram": "target"}
# vLLM's own speedup, when vllm-target ran too; anyspec against llama.cpp's target alone
SECOND_BASELINE = {"vllm": "vllm-target", "anyspec-greedy": "llama.cpp", "anyspec-slem": "llama.cpp",
                   "anyspec-slem-predicted": "llama.cpp",
                   "target": "llama.cpp", "hf-uag": "llama.cpp", "llama.cpp-ngram": "llama.cpp"}
LLAMA_CPP_METHODS = ("llama.cpp", "llama.cpp-ngram")
VLLM_METHODS = ("vllm", "vllm-target")
# the ones a draft dtype changes
DRAFT_METHODS = ("anyspec-greedy", "anyspec-slem", "anyspec-slem-ngram", "anyspec-slem-predicted",
                 "anyspec-slem-chain", "anyspec-sampled")


def base(method: str) -> str:
    """The method a variant runs: ``anyspec-slem@bf16`` (its draft in bf16) runs ``anyspec-slem``."""
    return method.split("@")[0]
