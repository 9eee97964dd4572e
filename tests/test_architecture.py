"""The import graph of src/ (read with ast, top-level and function-level imports alike): no cycle, and every edge
points down the layers of docs/adding_an_op.md:

    reference.common <- reference.<op> <- kernels.<op> <- bench.<op>
    harness (generic) <- bench.<op>; harness may use reference.common, kernels._build, kernels._timing and
    kernels.probe only.

Also: every op of hotpaths.bench.OPS with CUDA sources has all the files an op consists of."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"


def _module_of(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["hotpaths", *parts])


def _modules() -> dict[str, Path]:
    return {_module_of(p): p for p in SRC.rglob("*.py")}


def _resolve(name: str, known: set[str]) -> str | None:
    """The longest known module that ``name`` is or lies in (``hotpaths.kernels.router_gemm.plan`` -> the package)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str | None] = []
            if isinstance(node, ast.Import):
                targets = [_resolve(a.name, known) for a in node.names if a.name.startswith("hotpaths")]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                if base.startswith("hotpaths"):
                    # `from hotpaths.bench import split_kv_decode_peers` imports that submodule
                    targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else _resolve(base, known)
                               for a in node.names]
            graph[mod].update(t for t in targets if t and t != mod)
    return graph


def _layer(mod: str) -> tuple[str, str | None]:
    """(layer, op or sub-name): ("reference", "common"), ("kernels", "router_gemm"), ("harness", "bench") ..."""
    parts = mod.split(".")
    return (parts[1] if len(parts) > 1 else "root", parts[2] if len(parts) > 2 else None)


def _violation(src: str, dst: str) -> str | None:
    (ls, ns), (ld, nd) = _layer(src), _layer(dst)
    if ls == "root" or src.startswith(dst + "."):  # the top-level package, or a package __init__ above src
        return None
    if ls == "reference" and ld != "reference":
        return "a reference imports only torch/numpy and hotpaths.reference"
    if ls == "reference" and ns == "common" and nd != "common":
        return "reference.common is the bottom layer"
    if ls == "kernels":
        if ld in ("harness", "bench"):
            return "kernels import only their reference, reference.common, kernels._build and kernels._timing"
        if ld == "kernels" and nd not in (None, ns, "_build", "_timing", "common"):
            return "an op's kernels do not import another op's kernels"
    if ls == "harness":
        if ld == "bench" and not (src == "hotpaths.harness.cli" and dst == "hotpaths.bench"):
            return "the harness knows no op (the CLI finds bench modules by name from hotpaths.bench.OPS)"
        if ld == "kernels" and nd not in (None, "_build", "_timing", "probe"):
            return "the harness imports only kernels._build, kernels._timing and kernels.probe"
        if ld == "reference" and nd not in (None, "common"):
            return "the harness imports only reference.common"
    return None


def test_graph_sees_known_edges():
    """The walker is not vacuous: edges the code certainly has are found."""
    g = import_graph()
    assert "hotpaths.reference.router_gemm" in g["hotpaths.kernels.router_gemm"]
    assert "hotpaths.kernels.split_kv_decode" in g["hotpaths.bench.split_kv_decode"]
    assert "hotpaths.bench.split_kv_decode_peers" in g["hotpaths.bench.split_kv_decode"]
    assert "hotpaths.harness.bench" in g["hotpaths.harness.ceilings"]
    assert "hotpaths.kernels.probe" in g["hotpaths.harness.ceilings"]  # a function-level import
    # one timing primitive under both the harness bench and the router's first-use tuner
    assert "hotpaths.kernels._timing" in g["hotpaths.harness.bench"]
    assert "hotpaths.kernels._timing" in g["hotpaths.kernels.router_gemm"]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    color: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(u: str) -> None:
        color[u] = 1
        stack.append(u)
        for v in sorted(graph.get(u, ())):
            if color.get(v, 0) == 0:
                visit(v)
            elif color[v] == 1:
                found.append(stack[stack.index(v):] + [v])
        stack.pop()
        color[u] = 2

    for u in sorted(graph):
        if color.get(u, 0) == 0:
            visit(u)
    return found


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle():
    cycles = _cycles(import_graph())
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_layers_point_one_way():
    bad = [f"{s} -> {d}: {why}" for s, ds in import_graph().items() for d in sorted(ds)
           if (why := _violation(s, d))]
    assert not bad, "\n".join(bad)


def test_violation_rules_catch_the_old_edges():
    """The edges this layout removed would fail the test again."""
    assert _violation("hotpaths.reference.router_gemm", "hotpaths.harness.tolerances")
    assert _violation("hotpaths.kernels.router_gemm", "hotpaths.harness.bench")
    assert _violation("hotpaths.harness.cmd_decode", "hotpaths.kernels.split_kv_decode")
    assert _violation("hotpaths.harness.decode_bench", "hotpaths.reference.split_kv_decode")
    assert _violation("hotpaths.harness.ceilings", "hotpaths.kernels.probe") is None


def _op_files(op: str) -> list[Path]:
    """The files docs/adding_an_op.md says an op consists of."""
    files = [SRC / "reference" / f"{op}.py", ROOT / "data" / "shapes" / f"{op}.yaml",
             SRC / "kernels" / op / "__init__.py", SRC / "kernels" / op / "ops.py", SRC / "bench" / f"{op}.py",
             ROOT / "tests" / f"test_{op}_ref.py", ROOT / "tests" / f"test_{op}_gpu.py",
             ROOT / "docs" / "ops" / f"{op}.md"]  # the per-op design note (step 8)
    return files


@pytest.mark.parametrize("op", __import__("hotpaths.bench", fromlist=["OPS"]).OPS)
def test_op_has_every_file(op):
    assert list((SRC / "kernels" / op).glob("*.cu")), f"{op} is in hotpaths.bench.OPS but has no CUDA sources"
    missing = [str(p.relative_to(ROOT)) for p in _op_files(op) if not p.exists()]
    assert not missing, f"{op} lacks {missing} (docs/adding_an_op.md)"
