"""Results tables: narrow long-format CSV plus a Markdown twin made from the same frame.

Every table and every ``--json`` CLI row uses COLUMNS first (a column that does not apply is empty), then any
op-specific columns. The published H20 figure sits in ``published_h20_us`` where one exists.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

from hotpaths.harness.env import REPO_ROOT

COLUMNS = ["op", "case", "impl", "dtype", "device", "median_us", "p10_us", "p90_us", "bytes", "gbps",
           "pct_of_ceiling", "rel_l2_err", "max_abs_err", "cosine", "published_h20_us", "run_id", "repro"]
REPORTED_DIR = REPO_ROOT / "data" / "reported"

if TYPE_CHECKING:  # pandas is imported lazily (about half a second at CLI start-up)
    import pandas


def normalize(rows) -> "pandas.DataFrame":
    """Rows (list of dicts or a DataFrame) -> DataFrame with COLUMNS first, extra columns after, in first-seen order."""
    import pandas as pd

    df = rows.copy() if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    extra = [c for c in df.columns if c not in COLUMNS]
    for c in COLUMNS:
        if c not in df.columns:
            df[c] = None
    return df[COLUMNS + extra]


def _fmt(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        return str(int(v))  # byte counts and sizes stay whole numbers even in float columns
    if isinstance(v, float):
        a = abs(v)
        if a != 0 and (a < 1e-3 or a >= 1e6):
            return f"{v:.3e}"
        return f"{v:.4g}" if a < 100 else f"{v:.1f}"
    return str(v).replace("|", "\\|")


def to_markdown(df) -> str:
    """A GitHub-flavoured Markdown table (no tabulate dependency); empty columns dropped for reading."""
    keep = [c for c in df.columns if df[c].map(lambda v: _fmt(v) != "").any()]
    lines = ["| " + " | ".join(keep) + " |", "|" + "|".join("---" for _ in keep) + "|"]
    for _, row in df[keep].iterrows():
        lines.append("| " + " | ".join(_fmt(row[c]) for c in keep) + " |")
    return "\n".join(lines) + "\n"


def save(rows, name: str, *, out_dir: Path | None = None, title: str | None = None) -> tuple[Path, Path]:
    """Write ``<out_dir>/<name>.csv`` and ``<name>.md``; out_dir defaults to hotpaths.harness.runs.results_dir().

    Both files are written aside and renamed into place together (a run killed midway leaves the previous pair
    whole), and left alone when only run ids would change (so the committed tables, and git, stay quiet when the
    numbers do not move; a changed number rewrites the pair with this run's id). Returns the two paths either way.
    Raises ValueError if name is not a plain file stem or rows is empty.
    """
    import io

    from hotpaths.harness.runs import results_dir, write_stable

    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"name: expected a plain file stem like 'decode_kv_distribution', got {name!r}")
    df = normalize(rows)
    if df.empty:
        raise ValueError(f"rows: table {name!r} has no rows")
    out_dir = Path(out_dir) if out_dir is not None else results_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = out_dir / f"{name}.csv", out_dir / f"{name}.md"
    buf = io.StringIO()
    df.to_csv(buf, index=False, float_format="%.6g", lineterminator="\n")
    head = f"# {title or name}\n\n"
    write_stable([(csv_path, buf.getvalue().encode()), (md_path, (head + to_markdown(df)).encode())])
    return csv_path, md_path


def load(path) -> "pandas.DataFrame":
    import pandas as pd

    return pd.read_csv(path, keep_default_na=True)


def published(name: str) -> "pandas.DataFrame":
    """A published table from data/reported/ by file stem (e.g. ``decode_fp8_kv_distribution_h20``) or by op
    (``split_kv_decode`` -> the decode table, ``router_gemm`` -> the router rows of claims.csv)."""
    import pandas as pd

    alias = {"split_kv_decode": "decode_fp8_kv_distribution_h20", "claims": "claims"}
    if name == "router_gemm":
        c = pd.read_csv(REPORTED_DIR / "claims.csv")
        return c[c["area"] == "router_gemm"].reset_index(drop=True)
    path = REPORTED_DIR / f"{alias.get(name, name)}.csv"
    if not path.exists():
        raise FileNotFoundError(f"name={name!r}: no published table {path.name} in {REPORTED_DIR}")
    return pd.read_csv(path)


def json_lines(rows) -> str:
    """One JSON object per row per line, with COLUMNS first (NaN -> null)."""
    df = normalize(rows)
    out = []
    for rec in df.to_dict(orient="records"):
        out.append(json.dumps({k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in rec.items()},
                              default=str))
    return "\n".join(out)
