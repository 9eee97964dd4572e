"""Faults: a CUDA error from one of our launches names the op and its sizes; a table write that dies midway (killed,
or an exception inside tables.save) leaves the previous table whole."""

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hotpaths.harness import tables
from hotpaths.kernels._build import check_status

ROOT = Path(__file__).resolve().parents[1]
OPS_WITH_LAUNCHES = ("split_kv_decode", "attention_prologue", "router_gemm", "fused_moe")


def test_check_status_names_the_op_and_code():
    check_status(0, "split_kv_decode attention (batch=4)")  # success is silent
    with pytest.raises(RuntimeError) as ei:
        check_status(700, "split_kv_decode attention (variant=v3, mode=dynamic, batch=4, q_heads=8, kv_heads=1)")
    msg = str(ei.value)
    assert msg.startswith("split_kv_decode attention (variant=v3") and "batch=4" in msg
    assert "CUDA error 700" in msg


def _status_calls(op: str) -> list[ast.Call]:
    tree = ast.parse((ROOT / "src" / "kernels" / op / "__init__.py").read_text())
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", ""))
            in ("check_status", "_check") and len(n.args) == 2]


def _message_text(node) -> str:
    """The literal parts of the message argument (an f-string's constant pieces and the names it formats)."""
    if isinstance(node, ast.Constant):
        return str(node.value)
    if isinstance(node, ast.JoinedStr):
        return "".join(_message_text(v.value) if isinstance(v, ast.FormattedValue) else str(v.value)
                       for v in node.values)
    return ast.unparse(node)


@pytest.mark.parametrize("op", OPS_WITH_LAUNCHES)
def test_every_launch_error_names_the_op_and_sizes(op):
    """Each check_status call site of an op passes a message that starts with the op slug and formats at least one
    size (NAME=...): the exception then says which launch failed and with what arguments."""
    calls = _status_calls(op)
    assert calls, f"{op}: no check_status call found (the launch result would go unchecked)"
    for c in calls:
        msg = c.args[1]
        if op == "fused_moe" and isinstance(msg, ast.Name):  # _check(code, what): the helper itself
            continue
        text = _message_text(msg)
        assert text.startswith(op), f"{op}: launch error message {text!r} does not start with the op slug"
        assert isinstance(msg, ast.JoinedStr) and "=" in text, f"{op}: message {text!r} carries no sizes"


def _old_table(out_dir: Path) -> tuple[bytes, bytes]:
    tables.save([{"op": "x", "case": "old", "median_us": 1.0}], "t", out_dir=out_dir, title="old")
    return (out_dir / "t.csv").read_bytes(), (out_dir / "t.md").read_bytes()


_CHILD = textwrap.dedent("""
    import os, signal, sys, threading
    out_dir = sys.argv[1]
    final = {os.path.join(out_dir, "t.csv"), os.path.join(out_dir, "t.md")}

    def die(*_):
        os.kill(os.getpid(), signal.SIGKILL)

    def hook(event, args):
        # an atomic save renames into place: die just before the first rename (nothing renamed yet);
        # a save that writes a final path directly: die a few ms after opening it (midway through the write)
        if event == "os.rename" and str(args[1]).startswith(out_dir):
            die()
        if event == "open" and str(args[0]) in final and args[1] not in (None, "r", "rb") and \\
                any(c in str(args[1]) for c in "wax+"):
            threading.Timer(0.005, die).start()

    from hotpaths.harness import tables
    rows = [{"op": "x", "case": f"new{i}", "median_us": float(i), "repro": "y" * 40} for i in range(20000)]
    sys.addaudithook(hook)
    tables.save(rows, "t", out_dir=out_dir, title="new")
    import time; time.sleep(5)  # a kill that lands after the save still counts as one
""")


def test_killed_save_leaves_previous_table_whole(tmp_path):
    old_csv, old_md = _old_table(tmp_path)
    env = dict(os.environ)
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path)], env=env, capture_output=True, timeout=120)
    assert proc.returncode == -9, f"the child was not killed (rc {proc.returncode}): {proc.stderr.decode()[-500:]}"
    assert (tmp_path / "t.csv").read_bytes() == old_csv, "t.csv is no longer the previous table"
    assert (tmp_path / "t.md").read_bytes() == old_md, "t.md is no longer the previous table"
    assert tables.load(tmp_path / "t.csv")["case"].tolist() == ["old"]


def test_save_raising_midway_leaves_previous_pair(tmp_path, monkeypatch):
    old_csv, old_md = _old_table(tmp_path)

    def boom(df):
        raise RuntimeError("injected failure while rendering the Markdown twin")

    monkeypatch.setattr(tables, "to_markdown", boom)
    with pytest.raises(RuntimeError, match="injected"):
        tables.save([{"op": "x", "case": "new", "median_us": 2.0}], "t", out_dir=tmp_path)
    assert (tmp_path / "t.csv").read_bytes() == old_csv
    assert (tmp_path / "t.md").read_bytes() == old_md
