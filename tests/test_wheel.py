"""The project as a user gets it: a wheel built from this tree, installed into a fresh venv.

The fresh venv borrows the dependencies (torch, transformers, ...) from this test's own
environment through a ``.pth`` line, so nothing is downloaded; anyspec itself comes from the wheel
only (checked), and the commands run from a folder outside the tree.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest
from tiny_models import CHATML, save_tiny_model
from tokenizer_files import ggml_vocab_file

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The fresh venv's bin folder, anyspec installed there from a wheel of this tree."""
    tmp = tmp_path_factory.mktemp("wheel")
    tree = tmp / "tree"  # a copy, so the build leaves nothing in the working tree
    shutil.copytree(ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp / "dist"), str(tree)], check=True, capture_output=True, timeout=600)
    wheel = next((tmp / "dist").glob("anyspec-*.whl"))
    env_dir = tmp / "venv"
    venv.create(env_dir, with_pip=True)
    bin_dir = env_dir / "bin"
    subprocess.run([bin_dir / "python", "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                   check=True, capture_output=True, timeout=600)
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = subprocess.run([bin_dir / "python", "-c", where], check=True, capture_output=True,
                          text=True).stdout.strip()
    (Path(site) / "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return bin_dir


def run(bin_dir: Path, *argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    out = subprocess.run([str(bin_dir / "anyspec"), *argv], cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def test_the_wheel_installs_and_runs_outside_the_tree(installed, tmp_path, tok_qwen2, tok_smollm2):
    where = subprocess.run([installed / "python", "-c", "import anyspec, sys; print(anyspec.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True, check=True).stdout.strip()
    assert Path(where).is_relative_to(installed.parent), where

    assert "generate" in run(installed, "--help", cwd=tmp_path).stdout

    report = json.loads(run(installed, "analyze", "--target", str(ggml_vocab_file("qwen2")),
                            "--draft", str(ggml_vocab_file("llama-spm")), "--json", cwd=tmp_path).stdout)
    assert report["intersection"]["draft_tokens"] > 1000

    target = save_tiny_model(tok_qwen2, tmp_path / "target", "qwen2", seed=0, chat_template=CHATML)
    draft = save_tiny_model(tok_smollm2, tmp_path / "draft", "llama", seed=1, chat_template=CHATML)
    out = run(installed, "bench", "--target", str(target), "--draft", str(draft), "--methods", "target",
              "anyspec-greedy", "--limit", "1", "--max-new-tokens", "4", "--dtype", "fp32", "--draft-dtype",
              "fp32", "--threads", "1", "--json", str(tmp_path / "bench.json"), cwd=tmp_path)
    result = json.loads((tmp_path / "bench.json").read_text())
    assert {r["set"] for r in result["runs"]} == {"code", "prose"}  # the shipped prompt files
    assert {r["method"] for r in result["runs"]} == {"target", "anyspec-greedy"}
    assert all(Path(p).is_relative_to(installed.parent) for p in result["config"]["prompts"])
    assert "| all | anyspec-greedy |" in out.stdout
