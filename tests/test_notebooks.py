"""Notebooks: committed stripped, a tagged parameters cell of literals, and each runs headless in the quick profile."""

import ast
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_reading_order_names():
    assert NOTEBOOKS and NOTEBOOKS[0].name == "00_conventions_and_ceilings.ipynb"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_stripped_with_parameters_cell(nb):
    cells = json.loads(nb.read_text())["cells"]
    for c in cells:
        if c["cell_type"] == "code":
            assert not c.get("outputs") and c.get("execution_count") is None, f"{nb.name} has outputs"
    params = [c for c in cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(params) == 1, f"{nb.name}: expected one cell tagged 'parameters'"
    tree = ast.parse("".join(params[0]["source"]))
    for node in tree.body:  # literals only, so papermill's injected cell can override every one
        assert isinstance(node, (ast.Assign, ast.AnnAssign)), ast.dump(node)
        ast.literal_eval(node.value)
    names = {t.id for n in tree.body for t in ([n.target] if isinstance(n, ast.AnnAssign) else n.targets)}
    for profile in ("quick", "full"):
        f = ROOT / "papermill_runs" / "params" / f"{nb.stem}.{profile}.yaml"
        assert f.exists(), f"missing {f.name}"
        import yaml
        keys = set((yaml.safe_load(f.read_text()) or {}).keys())
        assert keys <= names, f"{f.name} sets unknown parameters {keys - names}"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_papermill_reads_every_parameter(nb, caplog):
    # papermill infers each parameter's name, type and help from its line; a line it cannot parse (a comment
    # holding "=" or ":" of its own) prints "Unable to parse line" on every run and drops the parameter's help
    import logging

    from papermill.inspection import inspect_notebook

    with caplog.at_level(logging.WARNING):
        params = inspect_notebook(str(nb))
    assert not [r.getMessage() for r in caplog.records if "Unable to parse" in r.getMessage()]
    assert params, f"{nb.name}: papermill found no parameters"


@pytest.mark.notebook
@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_runs_headless_quick_profile(nb, tmp_path, monkeypatch):
    import papermill as pm
    import yaml

    monkeypatch.setenv("HOTPATHS_RESULTS_DIR", str(tmp_path / "results"))
    monkeypatch.setenv("HOTPATHS_PROFILES_DIR", str(tmp_path / "profiles"))
    monkeypatch.setenv("HOTPATHS_RUN_ID", "test")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    params = yaml.safe_load((ROOT / "papermill_runs" / "params" / f"{nb.stem}.quick.yaml").read_text()) or {}
    pm.execute_notebook(str(nb), str(tmp_path / nb.name), parameters=params, kernel_name="python3",
                        cwd=str(nb.parent), progress_bar=False)
    assert list((tmp_path / "results").glob("*.csv")), f"{nb.name} wrote no table"
