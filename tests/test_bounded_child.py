"""The GPU tests' child deadline (tests/bounded_child.py): a child that hangs, with a grandchild of its own (an EP
rank), fails the test within the deadline and leaves no process behind; a quick child passes its output through."""

import os
import sys
import time

import pytest
from bounded_child import run_child


def test_hung_child_fails_and_its_group_is_killed(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    code = ("import subprocess, sys, time; "
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            f"open({str(pidfile)!r}, 'w').write(str(p.pid)); time.sleep(60)")
    t0 = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match="no result within 2 s"):
        run_child([sys.executable, "-c", code], timeout=2, what="sleeper")
    assert time.monotonic() - t0 < 15
    pid = int(pidfile.read_text())
    for _ in range(50):  # SIGKILL is asynchronous: give the kernel a moment to reap
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"grandchild {pid} outlived the deadline")


def test_quick_child_passes_output_through():
    r = run_child([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"])
    assert (r.returncode, r.stdout.strip(), r.stderr.strip()) == (3, "out", "err")
