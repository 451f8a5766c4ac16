"""Two builds of anyspec's CPU kernel on the same model, alternating in one process.

    python benchmarks/kernel_ab.py --base HEAD~1 [--model qwen2.5-coder-1.5b] [--isa 2] [--repeats 8]
        [--shapes 1x1 1x4 4x1 1x6 1x8 1x48] [--threads 2] [--cache 100]

``--base`` is a git revision: its ``csrc/`` is built as a second extension next to the working
tree's, and the model's forwards run on one build, then on the other, case after case, the order
flipping every repeat, so that drift of a noisy machine falls on both. A shape ``SxR`` is S
sequences of R new rows each, on caches of ``--cache`` tokens (``1x48``: a prefill, last row's logits
only). Reported per shape: the median milliseconds of each build, their ratio, and whether the
logits are the same bits (they must be: a kernel change may change speed, never results).
``--isa 1`` runs both builds' AVX2 path on a CPU that has AVX-512.

``--generate N``: instead of the shapes, greedy generations of N tokens on the bench prompts
(``--limit`` of each set), each build as the target alone and as the target of the default draft
(SLEM, the default config; the draft on the same build), prompt after prompt, the order flipping
each time. Reported per build: tok/s of both, speculation's speedup over its own target alone, and
whether every answer is the same tokens (it must be).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
CSRC = "src/anyspec/backends/csrc"


def check_base(revision: str) -> None:
    """Exit with a one-line error (status 2) unless git can read the kernel's sources at ``revision``
    in the checkout this script belongs to."""
    def fail(problem: str) -> None:
        print(f"kernel_ab.py: {problem}", file=sys.stderr)
        raise SystemExit(2)

    def git(*args: str) -> bool:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True).returncode == 0

    try:
        inside = git("rev-parse", "--is-inside-work-tree")
    except FileNotFoundError:
        fail("git is not installed; --base is a git revision whose kernel sources it reads")
    if not inside:
        fail(f"{ROOT} is not a git checkout, and --base is a git revision: run this script from a clone "
             "of anyspec")
    if not git("rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}"):
        fail(f"--base {revision}: no such revision in {ROOT}")
    if not git("cat-file", "-e", f"{revision}:{CSRC}"):
        fail(f"--base {revision} has no {CSRC} to build")


def build_at(revision: str, into: Path):
    """The kernel as it was at ``revision``, compiled under another module name."""
    from anyspec.backends.build import compile_kernel

    listing = subprocess.run(["git", "ls-tree", "--name-only", f"{revision}:{CSRC}"], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout.split()
    names = [n for n in listing if n.endswith((".cpp", ".h"))]
    src = into / "src"
    src.mkdir(parents=True)
    for name in names:
        text = subprocess.run(["git", "show", f"{revision}:{CSRC}/{name}"], cwd=ROOT, check=True,
                              capture_output=True, text=True).stdout
        (src / name).write_text(text)
    tag = subprocess.run(["git", "rev-parse", "--short", revision], cwd=ROOT, check=True, capture_output=True,
                         text=True).stdout.strip()
    sources = [src / n for n in names if n.endswith(".cpp")]
    return compile_kernel(f"anyspec_rowwise_{tag}", sources, into, src)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="git revision to compare the working tree with")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", help="built-in name or GGUF file")
    ap.add_argument("--isa", type=int, default=None, help="instruction-set level for both (0, 1, 2, 3)")
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--shapes", nargs="+", default=["1x1", "1x4", "4x1", "1x6", "1x8", "1x48"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache", type=int, default=100, help="tokens cached before each shape's rows")
    ap.add_argument("--generate", type=int, default=0, metavar="N", help="time generations of N tokens")
    ap.add_argument("--limit", type=int, default=2, help="prompts of each set, with --generate")
    args = ap.parse_args()
    check_base(args.base)
    torch.set_num_threads(args.threads)
    from anyspec.backends.gguf import GGUFModel
    from anyspec.backends.load import load_model

    model = load_model(args.model, dtype="gguf", name="target")
    with tempfile.TemporaryDirectory(prefix="kernel-ab-") as tmp:
        base_kernel = build_at(args.base, Path(tmp))
    # a build's Arch, Layer and Product objects go to its own functions only: one model per build
    models = {"working tree": model, args.base: GGUFModel(model.path, "target", kernel=base_kernel)}
    if args.isa is not None:
        for m in models.values():
            m.kernel.set_isa(args.isa)
    if args.generate:
        return generate_ab(models, args)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes]
    ids = torch.randint(100, 20000, (args.cache,), generator=torch.Generator().manual_seed(0)).tolist()
    seqs = {}
    for name, m in models.items():
        seqs[name] = [m.new_sequence() for _ in range(max(s for s, _ in shapes))]
        for seq in seqs[name]:
            m.forward([(seq, ids, 1)])
    times = {(shape, name): [] for shape in shapes for name in models}
    logits = {}
    for rep in range(args.repeats):
        for shape in shapes:
            n_seqs, rows = shape
            for name in list(models)[::1 if rep % 2 else -1]:
                step = list(range(5, 5 + rows))
                batch = [(seq, step, 1 if rows > 16 else None) for seq in seqs[name][:n_seqs]]
                start = time.perf_counter()
                out = models[name].forward(batch)
                times[(shape, name)].append(time.perf_counter() - start)
                for seq in seqs[name][:n_seqs]:
                    seq.crop(len(ids))
                logits.setdefault((shape, name), out)
    base, new = args.base, "working tree"
    print(f"{args.model}, isa {models[new].kernel.isa()}, {args.threads} threads, "
          f"median of {args.repeats} alternating repeats")
    print(f"| shape | {base} ms | working tree ms | working tree ÷ {base} | same bits |")
    print("|---|---:|---:|---:|---|")
    for shape in shapes:
        a, b = (1000 * statistics.median(times[(shape, n)]) for n in (base, new))
        pairs = zip(logits[(shape, base)], logits[(shape, new)], strict=True)
        same = all(torch.equal(x, y) for x, y in pairs)
        print(f"| {shape[0]}x{shape[1]} | {a:.1f} | {b:.1f} | {b / a:.2f} | {'yes' if same else 'NO'} |")
        if not same:
            sys.exit(f"the builds' logits differ for {shape[0]}x{shape[1]}: a kernel change altered results")


def generate_ab(models: dict, args) -> None:
    """Each build's target alone and with the default draft, alternating prompt by prompt."""
    from anyspec.backends.gguf import GGUFModel
    from anyspec.backends.load import load_model
    from anyspec.bench.prompts import DEFAULT_PROMPTS, load_prompts
    from anyspec.config import SamplingParams
    from anyspec.engine import Engine
    from anyspec.models import DEFAULT_DRAFT

    draft = load_model(DEFAULT_DRAFT, dtype="gguf", name="draft")
    drafts = {name: draft if m.kernel is draft.kernel else GGUFModel(draft.path, "draft", kernel=m.kernel)
              for name, m in models.items()}  # each build runs its draft too
    engines = {(name, mode): Engine(m, drafts[name] if mode == "slem" else None)
               for name, m in models.items() for mode in ("target", "slem")}
    prompts = [p for path in DEFAULT_PROMPTS for p in load_prompts(path)[:args.limit]]
    params = SamplingParams(max_new_tokens=args.generate)
    seconds, tokens, answers = dict.fromkeys(engines, 0.0), dict.fromkeys(engines, 0), {}
    for i, prompt in enumerate(prompts):
        for key in list(engines)[::1 if i % 2 else -1]:
            start = time.perf_counter()
            result = engines[key].generate(prompt["prompt"], params)
            seconds[key] += time.perf_counter() - start
            tokens[key] += len(result.token_ids)
            answers.setdefault(prompt["id"], set()).add(tuple(result.token_ids))
    print(f"{len(prompts)} prompts, {args.generate} new tokens, isa {models['working tree'].kernel.isa()}, "
          f"{args.threads} threads, alternating")
    print("| build | target alone tok/s | SLEM tok/s | SLEM ÷ target alone |")
    print("|---|---:|---:|---:|")
    for name in models:
        alone, slem = (tokens[(name, m)] / seconds[(name, m)] for m in ("target", "slem"))
        print(f"| {name} | {alone:.2f} | {slem:.2f} | {slem / alone:.2f}x |")
    same = all(len(a) == 1 for a in answers.values())
    print(f"every answer the same tokens: {'yes' if same else 'NO'}")
    if not same:
        sys.exit("the builds or methods gave different answers")


if __name__ == "__main__":
    main()
