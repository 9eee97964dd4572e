"""Executed notebooks keep their figures, and a second reproduce with unchanged numbers changes no file."""

import json
import re
from pathlib import Path

import pytest

from hotpaths.harness import reproduce as rp
from hotpaths.harness.env import REPO_ROOT


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.notebook
def test_figures_inline_and_second_run_changes_nothing(tmp_path, capfd):
    assert rp.reproduce(only="01", device="cpu", out_root=tmp_path) == 0
    out, err = capfd.readouterr()  # the kernel process writes to the same file descriptors
    assert "running over TCP" not in out + err  # the kernels talk over IPC
    nb = json.loads((tmp_path / "papermill_runs/cpu/01_split_kv_scheduling.ipynb").read_text())
    drawing = [c for c in nb["cells"] if c["cell_type"] == "code" and re.search(r"^plt\.|; plt\.show\(\)",
                                                                                "".join(c["source"]), re.M)
               and "plt.show()" in "".join(c["source"])]
    assert len(drawing) >= 3
    for c in drawing:  # every top-level plt.show() leaves its figure in the executed notebook
        kinds = [o.get("data", {}).keys() for o in c["outputs"]]
        assert any("image/png" in k for k in kinds), "".join(c["source"])[:120]
    # the same figures as PNG beside the tables, without a date stamp
    pngs = sorted((tmp_path / "data/results/cpu").glob("*.png"))
    assert {p.stem for p in pngs} >= {"split_kv_task_maps", "split_kv_per_cta_tiles", "split_kv_skew_speedup"}
    assert all(b"Software" not in p.read_bytes()[:200] and b"tIME" not in p.read_bytes() for p in pngs)
    # papermill's timestamps are gone
    assert "start_time" not in json.dumps(nb["metadata"]) and "duration" not in json.dumps(nb["cells"][3]["metadata"])

    before = _files(tmp_path)
    assert rp.reproduce(only="01", device="cpu", out_root=tmp_path) == 0
    after = _files(tmp_path)
    changed = [k for k in after if before.get(k) != after[k]]
    assert changed == [] and set(after) == set(before)


def test_a_changed_number_rewrites_the_table_and_the_manifest(tmp_path, monkeypatch):
    """Staged tables that differ only in run ids are not moved; a changed number is, and the manifest then names
    this run and lists the run that wrote each file."""
    from hotpaths.harness import runs

    res = tmp_path / "data/results/cpu"
    res.mkdir(parents=True)
    (res / "t.csv").write_text("op,median_us,run_id\nx,1.5,20260101T000000Z-cpu-quick\n")
    staged = tmp_path / "stage"
    staged.mkdir()
    (staged / "t.csv").write_text("op,median_us,run_id\nx,1.5,20261201T000000Z-cpu-quick\n")
    moved, kept = rp._move_tree(staged, res)
    assert moved == [] and kept == [res / "t.csv"]
    assert "20260101T000000Z" in (res / "t.csv").read_text()
    (staged / "t.csv").write_text("op,median_us,run_id\nx,1.6,20261201T000000Z-cpu-quick\n")
    moved, kept = rp._move_tree(staged, res)
    assert moved == [res / "t.csv"] and "1.6,20261201T000000Z" in (res / "t.csv").read_text()
    assert runs.same_but_run_ids(b"a 20260101T000000Z-h200-full b", b"a 20261231T235959Z-h200-full b")
    assert not runs.same_but_run_ids(b"a 1.5 20260101T000000Z-h200-full", b"a 1.6 20260101T000000Z-h200-full")


def test_no_notebook_forces_a_non_inline_backend():
    """matplotlib.use("Agg") in a notebook would throw its figures away even under the inline backend."""
    for nb in sorted((REPO_ROOT / "notebooks").glob("*.ipynb")):
        src = "".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"])
        assert "matplotlib.use(" not in src, nb.name
    assert rp.INLINE_BACKEND == "module://matplotlib_inline.backend_inline"


def test_checkout_path_and_git_revision_do_not_count_as_changes(tmp_path):
    """A fresh clone elsewhere, or a new commit, prints another staging path and revision in the setup banner: the
    executed notebook is kept unless something else changed."""
    res, staged = tmp_path / "res", tmp_path / "stage"
    res.mkdir()
    staged.mkdir()
    old = ('"  git_revision: 0123456789ab\\n", "results_dir: /old/clone/papermill_runs/.staging-'
           '20260101T000000Z-cpu-quick/results", "1.5"')
    new = (f'"  git_revision: ba9876543210+dirty\\n", "results_dir: {tmp_path}/papermill_runs/.staging-'
           f'20261201T000000Z-cpu-quick/results", "1.5"')
    (res / "nb.ipynb").write_text(old)
    (staged / "nb.ipynb").write_text(new)
    moved, kept = rp._move_tree(staged, res, tmp_path)
    assert moved == [] and kept == [res / "nb.ipynb"] and (res / "nb.ipynb").read_text() == old
    (staged / "nb.ipynb").write_text(new.replace('"1.5"', '"1.6"'))
    moved, kept = rp._move_tree(staged, res, tmp_path)
    assert moved == [res / "nb.ipynb"] and '"1.6"' in (res / "nb.ipynb").read_text()
