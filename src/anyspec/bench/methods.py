"""The bench's methods by name, and what each one's speedup is measured against."""

METHODS = ("target", "anyspec-greedy", "anyspec-slem", "anyspec-sampled", "llama.cpp", "hf-target", "hf-uag",
           "vllm-target", "vllm")
DEFAULT_METHODS = [m for m in METHODS if m != "vllm-target"]  # a second vLLM instance: opt-in (memory)
BASELINE = {"anyspec-greedy": "target", "anyspec-slem": "target", "anyspec-sampled": "target",
            "hf-uag": "hf-target", "hf-target": "target", "vllm-target": "target", "vllm": "target",
            "llama.cpp": "target"}
# vLLM's own speedup, when vllm-target ran too; anyspec against llama.cpp's target alone
SECOND_BASELINE = {"vllm": "vllm-target", "anyspec-greedy": "llama.cpp", "anyspec-slem": "llama.cpp",
                   "target": "llama.cpp", "hf-uag": "llama.cpp"}
VLLM_METHODS = ("vllm", "vllm-target")
DRAFT_METHODS = ("anyspec-greedy", "anyspec-slem", "anyspec-sampled")  # the ones a draft dtype changes


def base(method: str) -> str:
    """The method a variant runs: ``anyspec-slem@bf16`` (its draft in bf16) runs ``anyspec-slem``."""
    return method.split("@")[0]
