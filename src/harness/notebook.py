"""Small helpers shared by the notebooks' setup cells (kept here so notebooks stay thin)."""

from __future__ import annotations

from hotpaths.harness.env import REPO_ROOT, device_info
from hotpaths.harness.runs import results_dir, run_id
from hotpaths.harness.tables import load, normalize


def setup_banner() -> dict:
    """Print and return device, versions, git revision, run id and where results go."""
    info = device_info()
    info["run_id"] = run_id()
    info["results_dir"] = str(results_dir())
    for k in ("device", "device_tag", "torch", "cuda_runtime", "driver", "git_revision", "run_id", "results_dir"):
        print(f"{k:>14}: {info.get(k)}")
    return info


def show(df_or_rows, cols=None, n: int | None = None):
    """Display a table (Markdown-rendered DataFrame in Jupyter, plain text in a terminal)."""
    import pandas as pd

    df = df_or_rows if isinstance(df_or_rows, pd.DataFrame) else normalize(df_or_rows)
    if cols:
        df = df[[c for c in cols if c in df.columns]]
    if n:
        df = df.head(n)
    try:
        from IPython.display import display

        display(df)
    except ImportError:
        print(df.to_string())
    return df


def stored(name: str, *, device: str = "h200"):
    """The committed table data/results/<device>/<name>.csv as a DataFrame (every column), or None (with a printed
    reason) when no stored table exists."""
    path = REPO_ROOT / "data" / "results" / device / f"{name}.csv"
    if not path.exists():
        print(f"no stored {device} table {name} (expected {path})")
        return None
    df = load(path)
    print(f"stored {device} results: {path.relative_to(REPO_ROOT)} (run {df['run_id'].iloc[0] if len(df) else '?'})")
    return df


def show_stored(name: str, *, device: str = "h200", cols=None, where: dict | None = None):
    """On a machine without the GPU, show the committed table data/results/<device>/<name>.csv (the run recorded in
    papermill_runs/<device>/manifest.json). ``where``: column -> allowed values to filter rows. Returns the frame as
    shown (``cols`` only), or None (with a printed reason) when no stored table exists."""
    df = stored(name, device=device)
    if df is None:
        return None
    for col, allowed in (where or {}).items():
        df = df[df[col].isin(list(allowed))]
    return show(df.reset_index(drop=True), cols=cols)


def timing_studies(device: str = "h200"):
    """The two committed timing-method measurements (data/profiles/<device>/), as two DataFrames: rows of
    timing_method.txt
    (studies/gpu_timing_method.py: per flush mode and job, us with events on the stream around the graph replay,
    eager, and events inside the graph) and of flush_study.json (studies/gpu_flush_study.py: per job, the mean
    median us after a "write" and a "read" L2 flush, and their ratio). Raises FileNotFoundError naming a missing
    file."""
    import json
    import re

    import pandas as pd

    d = REPO_ROOT / "data" / "profiles" / device
    method, flush = [], []
    pat = re.compile(r"flush=(\w+)\s+(.+?)\s+graph\s+([\d.]+) us\s+eager\s+([\d.]+) us"
                     r"\s+events-inside-graph ([\d.]+) us")
    for line in (d / "timing_method.txt").read_text().splitlines():
        m = pat.match(line.strip())
        if m:
            method.append(dict(flush=m[1], job=m[2], stream_events_us=float(m[3]), eager_us=float(m[4]),
                               graph_events_us=float(m[5])))
    for job, modes in json.loads((d / "flush_study.json").read_text()).items():
        w, r = sum(modes["write"]) / len(modes["write"]), sum(modes["read"]) / len(modes["read"])
        flush.append(dict(job=job, write_flush_us=round(w, 2), read_flush_us=round(r, 2),
                          read_over_write=round(r / w, 3)))
    return pd.DataFrame(method), pd.DataFrame(flush)


def save_figure(fig, name: str, *, out_dir=None, dpi: int = 100):
    """Save ``fig`` as ``<results_dir>/<name>.png`` beside the tables (reproduce moves it to data/results/<device>/).

    The PNG carries no date or software stamp, and the file is rewritten only when its pixels change, so a re-run
    that draws the same figure leaves git quiet. Returns the path. Raises ValueError if name is not a plain file
    stem.
    """
    import io
    from pathlib import Path

    from hotpaths.harness.runs import results_dir, write_stable

    if not name or "/" in name or name.startswith(".") or name.endswith(".png"):
        raise ValueError(f"name: expected a plain file stem like 'decode_skew_sweep', got {name!r}")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
    path = Path(out_dir if out_dir is not None else results_dir()) / f"{name}.png"
    write_stable([(path, buf.getvalue())])
    return path
