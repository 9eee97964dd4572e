"""environment.yml is a valid conda environment that installs this project and agrees with pyproject.toml."""

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _name(req: str) -> str:
    return re.split(r"[<>=!~\[ ;]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_environment_matches_pyproject_and_the_pins():
    """environment.yml installs every pyproject dependency (dev and lab included) at the version constraints/cpu.txt
    pins, within pyproject's lower bound, and is exactly what constraints/environment_yml.py generates."""
    import runpy

    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert env["name"] == "hotpaths" and "conda-forge" in env["channels"]
    deps = env["dependencies"]
    assert "python=3.11" in deps and "pip" in deps  # the Python CI runs
    pip = next(d["pip"] for d in deps if isinstance(d, dict) and "pip" in d)
    assert "-e ." in pip, "the pip section must install this project"
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in pip  # a CPU torch, not PyPI's CUDA build
    env_reqs = {_name(r): r.replace(" ", "") for r in pip if not r.startswith("-")}
    pins = {_name(l): l.strip() for l in (ROOT / "constraints" / "cpu.txt").read_text().splitlines()
            if l.strip() and not l.startswith("#")}
    assert env_reqs == {k: v.replace(" ", "") for k, v in pins.items()}  # the same pins, all of them
    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = list(proj["dependencies"]) + proj["optional-dependencies"]["dev"] + proj["optional-dependencies"]["lab"]
    from packaging.requirements import Requirement

    for req in wanted:
        r = Requirement(req)
        assert _name(req) in env_reqs, f"{req} missing from environment.yml"
        assert r.specifier.contains(env_reqs[_name(req)].split("==")[1]), f"pin of {req} below its lower bound"
    assert proj["requires-python"] == ">=3.11"
    gen = runpy.run_path(str(ROOT / "constraints" / "environment_yml.py"))
    assert (ROOT / "environment.yml").read_text() == gen["render"](), "run `make environment.yml`"


def test_constraints_pin_every_dependency():
    pins = {_name(l): l for l in (ROOT / "constraints" / "cpu.txt").read_text().splitlines()
            if l.strip() and not l.startswith("#")}
    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for req in proj["dependencies"] + proj["optional-dependencies"]["dev"] + proj["optional-dependencies"]["lab"]:
        assert _name(req) in pins and "==" in pins[_name(req)], f"{req} not pinned in constraints/cpu.txt"


def test_package_maps_one_import_root():
    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert proj["tool"]["setuptools"]["package-dir"] == {"hotpaths": "src"}
    pkgs = proj["tool"]["setuptools"]["packages"]
    assert all(p == "hotpaths" or p.startswith("hotpaths.") for p in pkgs)
    for p in pkgs:  # every listed package exists and every package on disk is listed
        assert (ROOT / "src" / Path(*p.split(".")[1:]) / "__init__.py").exists(), p
    on_disk = {"hotpaths." + ".".join(f.parent.relative_to(ROOT / "src").parts)
               if f.parent != ROOT / "src" else "hotpaths" for f in (ROOT / "src").rglob("__init__.py")}
    assert on_disk == set(pkgs)
