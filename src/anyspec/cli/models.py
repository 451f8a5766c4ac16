"""``anyspec models``: list, fetch or locate the built-in models."""

from __future__ import annotations

from pathlib import Path

from anyspec.models import MODELS, fetch_model, gguf_cached, gguf_path, is_cached, model_dir
from anyspec.paths import cache_dir


def add_parser(sub) -> None:
    p = sub.add_parser("models", help="list, fetch or locate the built-in models")
    msub = p.add_subparsers(dest="models_command", required=True, metavar="{list,fetch,path}")
    msub.add_parser("list", help="the built-in models, their role, size and whether they are cached")
    f = msub.add_parser("fetch", help="download and verify a built-in model's GGUF file (or 'all')")
    f.add_argument("name", choices=[*MODELS, "all"], metavar="NAME",
                   help=f"a built-in model ({', '.join(MODELS)}), or all for every one")
    f.add_argument("--quiet", action="store_true", help="no progress bars")
    f.add_argument("--bf16", action="store_true", help="also convert it to the folder --dtype bf16 runs")
    pa = msub.add_parser("path", help="print a built-in model's GGUF file, fetching it if needed")
    pa.add_argument("name", choices=list(MODELS), metavar="NAME",
                    help=f"a built-in model: {', '.join(MODELS)}")
    pa.add_argument("--bf16", action="store_true",
                    help="the bf16 folder instead (for vLLM, transformers), converted from the GGUF file on "
                         "first use: a minute or more, and its size in bf16 on disk")
    p.set_defaults(func=run)


def _folder_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _mb(n: int) -> str:
    return f"{n / 1e6:,.0f} MB"


def run(args) -> int:
    if args.models_command == "list":
        print(f"{'name':<20} {'role':<38} {'GGUF':>9} {'cached':>9} {'bf16':>9}  source")
        for m in MODELS.values():
            cached = "yes" if gguf_cached(m.name) else "no"
            bf16 = _mb(_folder_size(model_dir(m.name))) if is_cached(m.name) else "-"
            print(f"{m.name:<20} {m.role:<38} {_mb(m.size):>9} {cached:>9} {bf16:>9}  "
                  f"{m.source}; {m.license}")
        print(f"cache: {cache_dir()}")
        return 0
    if args.models_command == "fetch":
        for name in MODELS if args.name == "all" else [args.name]:
            print(gguf_path(name, progress=not args.quiet))
            if args.bf16:
                print(fetch_model(name, progress=not args.quiet))
        return 0
    print(fetch_model(args.name) if args.bf16 else gguf_path(args.name))
    return 0
