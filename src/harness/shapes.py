"""Case-string helpers for the command line, and the shape files ``data/shapes/<op>.yaml``.

The grammar itself lives in the bottom layer (``hotpaths.reference.common``) so references and kernels can parse a
case without importing the harness; it is re-exported here for the CLI and the notebooks.
"""

from __future__ import annotations

import functools

from hotpaths.harness.env import REPO_ROOT
from hotpaths.reference.common import CaseError, expand_lengths, format_case, parse_cases, parse_int_list

__all__ = ["CaseError", "expand_lengths", "format_case", "parse_cases", "parse_int_list", "case_list_arg",
           "int_list_arg", "positive_int_arg", "load_shapes", "SHAPES_DIR"]

SHAPES_DIR = REPO_ROOT / "data" / "shapes"


@functools.lru_cache(maxsize=None)
def _load(op: str) -> dict:
    import yaml

    path = SHAPES_DIR / f"{op}.yaml"
    if not path.exists():
        known = sorted(p.stem for p in SHAPES_DIR.glob("*.yaml"))
        raise ValueError(f"op={op!r}: no shape file {path} (known: {known})")
    with open(path) as f:
        return yaml.safe_load(f) or {}


def load_shapes(op: str, key: str | None = None):
    """The parsed ``data/shapes/<op>.yaml`` (a dict), or one top-level entry of it. The files are the one place
    that names an op's cases: tests, notebooks, benchmarks and the CLI read them. Raises ValueError for an unknown
    op or key."""
    d = _load(op)
    if key is None:
        return d
    if key not in d:
        raise ValueError(f"{op}.yaml has no entry {key!r} (entries: {sorted(d)})")
    return d[key]


def case_list_arg(spec: str) -> list[str]:
    """argparse type for ``--cases``: ';'- or ','-separated case strings, each validated (exit code 2 on error)."""
    import argparse

    parts = [p.strip() for p in spec.replace(";", ",").split(",") if p.strip()]
    try:
        if not parts:
            raise CaseError(f"--cases {spec!r}: expected at least one case like '64x4K'")
        for p in parts:
            parse_cases(p)
    except CaseError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return parts


def int_list_arg(name: str, *, minimum: int = 0):
    """argparse type factory for comma-separated integers >= minimum (``--m 1,2,4``)."""
    import argparse

    def conv(spec: str) -> list[int]:
        try:
            return parse_int_list(spec, name, minimum=minimum)
        except CaseError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return conv


def positive_int_arg(name: str, *, minimum: int = 1):
    """argparse type factory for one integer >= minimum (``--iters 100``); the message names the option."""
    import argparse

    def conv(spec: str) -> int:
        try:
            v = int(spec)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} {spec!r}: expected an integer >= {minimum}") from None
        if v < minimum:
            raise argparse.ArgumentTypeError(f"{name} {spec!r}: expected an integer >= {minimum}")
        return v
    return conv
