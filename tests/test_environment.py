"""environment.yml is a valid conda environment that installs this project and agrees with pyproject.toml."""

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _name(req: str) -> str:
    return re.split(r"[<>=!~\[ ;]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_environment_matches_pyproject():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert env["name"] == "hotpaths" and "conda-forge" in env["channels"]
    deps = env["dependencies"]
    assert any(isinstance(d, str) and d.startswith("python") for d in deps) and "pip" in deps
    pip = next(d["pip"] for d in deps if isinstance(d, dict) and "pip" in d)
    assert "-e ." in pip, "the pip section must install this project"
    env_reqs = {_name(r): r.replace(" ", "") for r in pip if not r.startswith("-")}
    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = list(proj["dependencies"]) + proj["optional-dependencies"]["dev"] + proj["optional-dependencies"]["lab"]
    for req in wanted:
        assert _name(req) in env_reqs, f"{req} missing from environment.yml"
        assert env_reqs[_name(req)] == req.replace(" ", ""), f"{req} differs in environment.yml"
    assert proj["requires-python"] == ">=3.11"


def test_constraints_pin_every_dependency():
    pins = {_name(l): l for l in (ROOT / "constraints" / "cpu.txt").read_text().splitlines()
            if l.strip() and not l.startswith("#")}
    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for req in proj["dependencies"] + proj["optional-dependencies"]["dev"]:
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
