import json

import pytest

from hotpaths.harness import reproduce as rp


@pytest.mark.notebook
def test_reproduce_writes_manifest_and_tables(tmp_path):
    code = rp.reproduce(profile="quick", only="00", device="cpu", out_root=tmp_path)
    assert code == 0
    nb = tmp_path / "papermill_runs" / "cpu" / "00_conventions_and_ceilings.ipynb"
    assert nb.exists()
    man = json.loads((tmp_path / "papermill_runs" / "cpu" / "manifest.json").read_text())
    assert man["device_tag"] == "cpu" and man["profile"] == "quick" and man["git_revision"]
    assert man["notebooks"]["00_conventions_and_ceilings.ipynb"]["status"] == "ok"
    assert man["notebooks"]["00_conventions_and_ceilings.ipynb"]["parameters"]["copy_mib"] == 256
    assert "torch" in man and "run_id" in man
    ceil = tmp_path / "data" / "results" / "cpu" / "ceilings.csv"
    assert ceil.exists() and "data/results/cpu/ceilings.csv" in man["files"]
    import hashlib
    assert man["files"]["data/results/cpu/ceilings.csv"] == hashlib.sha256(ceil.read_bytes()).hexdigest()
    assert not list((tmp_path / "papermill_runs").glob(".staging-*"))


def test_failing_notebook_leaves_tables_untouched(tmp_path, monkeypatch):
    import nbformat

    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    nb = nbformat.v4.new_notebook()
    p = nbformat.v4.new_code_cell("x = 1")
    p.metadata["tags"] = ["parameters"]
    nb.cells = [p, nbformat.v4.new_code_cell("raise RuntimeError('boom')")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, nbdir / "98_fails.ipynb")
    monkeypatch.setattr(rp, "NOTEBOOKS", nbdir)
    old = tmp_path / "data" / "results" / "cpu" / "ceilings.csv"
    old.parent.mkdir(parents=True)
    old.write_text("previous\n")
    assert rp.reproduce(only="98", device="cpu", out_root=tmp_path) == 1
    assert old.read_text() == "previous\n"
    assert not (tmp_path / "papermill_runs" / "cpu").exists()
    assert (tmp_path / "scratch" / "failed" / "98_fails.ipynb").exists()


def test_staging_paths_are_normalised_in_linear_time():
    # an executed notebook holds inline PNGs: long runs without white space, where a backtracking pattern took
    # minutes per notebook on the H200 (`hotpaths reproduce` stalled after the notebook had finished)
    import re
    import time

    from hotpaths.harness import reproduce as rp

    blob = b"iVBOR" + b"A" * 2_000_000
    data = b'{"png": "' + blob + b'", "text": "saved to /x/y/papermill_runs/.staging-RUN/results"}'
    t0 = time.perf_counter()
    got = rp._sub_staging(data)
    assert time.perf_counter() - t0 < 2.0
    assert got == b'{"png": "' + blob + b'", "text": "saved to <root>/papermill_runs/.staging-RUN/results"}'
    slow = re.compile(rb"[^\s\"'\\]*/papermill_runs/\.staging-")  # the definition it replaces, on small inputs
    for s in (b"a/papermill_runs/.staging-1 'b/c/papermill_runs/.staging-2\"", b"/papermill_runs/.staging-",
              b"x\\y/papermill_runs/.staging-z w/papermill_runs/.staging-v", b"no key here"):
        assert rp._sub_staging(s) == slow.sub(b"<root>/papermill_runs/.staging-", s), s
