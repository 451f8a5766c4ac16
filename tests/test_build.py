"""Building the kernel survives an interrupted build and says when it waits for another one."""

from __future__ import annotations

import select
import subprocess
import sys
import time
from pathlib import Path

from anyspec.paths import held

MODULE = """
#include <torch/extension.h>
int answer() { return 42; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("answer", &answer); }
"""

BUILD = """
import sys
from pathlib import Path
from anyspec.backends.build import compile_kernel
folder = Path(sys.argv[1])
print(compile_kernel("anyspec_lock_check", [folder / "answer.cpp"], folder, folder, ["-O0"]).answer())
"""


def test_a_build_interrupted_midway_does_not_hang_the_next_and_a_running_one_is_waited_for(tmp_path: Path):
    """torch leaves its ``lock`` file behind when a build is killed, and then waits for it forever,
    silently; a kernel build must remove such a lock, but wait (and say so) while another process
    really is building, and say that it compiles, which a load of the built kernel does not."""
    (tmp_path / "answer.cpp").write_text(MODULE)
    (tmp_path / "lock").write_text("")  # what a killed build leaves
    with held(tmp_path / "build.flock"):  # another build, running
        proc = subprocess.Popen([sys.executable, "-c", BUILD, str(tmp_path)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        waits_for("waiting for another process to finish building the CPU kernel", proc,
                  time.monotonic() + 300)
        assert proc.poll() is None and (tmp_path / "lock").exists()
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert out.strip() == "42"
    assert "removing the lock of an interrupted kernel build" in err
    assert "compiling its CPU kernel" in err
    assert not (tmp_path / "lock").exists()
    again = subprocess.run([sys.executable, "-c", BUILD, str(tmp_path)], capture_output=True, text=True,
                           timeout=300)
    assert again.stdout.strip() == "42" and "compiling" not in again.stderr


def waits_for(text: str, proc: subprocess.Popen, deadline: float) -> None:
    """Read ``proc``'s stderr until a line holds ``text``; fail at ``deadline`` (a build that hangs
    without a word, as torch's alone does) or when the process ends first."""
    while time.monotonic() < deadline:
        if select.select([proc.stderr], [], [], 1.0)[0]:
            line = proc.stderr.readline()
            if text in line:
                return
            assert line, f"the build ended without saying {text!r}"
    proc.kill()
    raise AssertionError(f"the build did not say {text!r} before the deadline")
