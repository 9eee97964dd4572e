"""A child process with a hard deadline for GPU tests: on timeout the child's whole process group (the spawned
ranks of an EP run included) is killed and the test FAILS with the output so far, instead of the suite hanging.

subprocess.run(timeout=...) kills only the direct child: ranks it spawned keep the GPU (and a NCCL rendezvous)
alive after the test has moved on, and a long timeout looks like a hang from the outside."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

CHILD_TIMEOUT_S = 60  # every GPU child here finishes in seconds on an H200 once the kernels are built


def run_child(cmd: list[str], *, timeout: float = CHILD_TIMEOUT_S, env: dict | None = None,
              what: str = "child") -> subprocess.CompletedProcess:
    """Run cmd in a new session, capturing text output; pytest.fail after `timeout` seconds (group killed).

    Returns the CompletedProcess (the caller asserts on returncode / output)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # a grandchild outside the group still holds the pipes
            out, err = "", ""
        pytest.fail(f"{what}: no result within {timeout:.0f} s (process group killed): {' '.join(cmd)[:300]}\n"
                    f"stdout tail: {(out or '')[-1500:]}\nstderr tail: {(err or '')[-1500:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
