import json
import subprocess
import sys

import pytest

from hotpaths.harness.cli import build_parser, main


def _run(*args):
    return subprocess.run([sys.executable, "-m", "hotpaths", *args], capture_output=True, text=True, timeout=300)


def test_help_everywhere(capsys):
    r = _run("--help")  # the `python -m hotpaths` entry point itself, once
    assert r.returncode == 0 and "reproduce" in r.stdout and "env" in r.stdout
    parser = build_parser()
    subs = parser._subparsers._group_actions[0].choices
    for name in subs:  # in process: a child per subcommand cost ~1.5 s each of CI's CPU budget
        with pytest.raises(SystemExit) as exc:
            main([name, "--help"])
        out = capsys.readouterr().out
        assert exc.value.code == 0 and "usage: hotpaths " + name in out, name


def test_env_json_on_cpu():
    r = _run("env", "--json", "--no-measure")
    assert r.returncode == 0
    info = json.loads(r.stdout)
    assert {"python", "torch", "device", "git_revision", "ceilings"} <= set(info)


def test_reproduce_dry_run_lists_notebooks():
    r = _run("reproduce", "--dry-run", "--only", "00")
    assert r.returncode == 0 and "00_conventions_and_ceilings.ipynb" in r.stdout


def test_reproduce_unknown_notebook_exit_2(capsys):
    assert main(["reproduce", "--only", "99", "--dry-run"]) == 2
    assert "no notebook numbered ['99']" in capsys.readouterr().err


def test_malformed_case_exit_2():
    r = _run("decode", "--cases", "3y4K")
    assert r.returncode == 2
    assert "'3y4K' is not <count>x<length>[K]" in r.stderr


@pytest.mark.parametrize("argv", [["decode", "--cases", "2x100+1x0", "--impl", "dynamic,static", "--json"],
                                  ["router", "--m", "1,3", "--n", "192", "--k", "256", "--json"]])
def test_op_json_rows_share_columns(argv):
    from hotpaths.harness.tables import COLUMNS

    r = _run(*argv)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
    assert rows
    for row in rows:
        assert list(row)[: len(COLUMNS)] == COLUMNS
        assert row["median_us"] is None  # CPU: no timing
        if row["impl"] == "hpc_ops":  # a same-run peer: on CPU its row says why it did not run
            assert row["note"].startswith("not available") and row["rel_l2_err"] is None
            continue
        assert row["impl"].endswith("_emulation")  # CPU: emulation
        assert row["rel_l2_err"] is not None and row["rel_l2_err"] < 1e-2


def test_decode_impl_parsing():
    from hotpaths.bench.split_kv_decode import parse_impls

    assert parse_impls("static,assign") == (["dynamic", "static_count", "static_chunk"], True)
    assert parse_impls("dynamic,dynamic") == (["dynamic"], False)
    with pytest.raises(ValueError, match="unknown 'nope'"):
        parse_impls("dynamic,nope")
