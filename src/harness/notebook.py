"""Small helpers shared by the notebooks' setup cells (kept here so notebooks stay thin)."""

from __future__ import annotations


def setup_banner() -> dict:
    """Print and return device, versions, git revision, run id and where results go."""
    from hotpaths.harness.env import device_info
    from hotpaths.harness.runs import results_dir, run_id

    info = device_info()
    info["run_id"] = run_id()
    info["results_dir"] = str(results_dir())
    for k in ("device", "device_tag", "torch", "cuda_runtime", "driver", "git_revision", "run_id", "results_dir"):
        print(f"{k:>14}: {info.get(k)}")
    return info


def show(df_or_rows, cols=None, n: int | None = None):
    """Display a table (Markdown-rendered DataFrame in Jupyter, plain text in a terminal)."""
    from hotpaths.harness.tables import normalize

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


def show_stored(name: str, *, device: str = "h200", cols=None, where: dict | None = None):
    """On a machine without the GPU, show the committed table data/results/<device>/<name>.csv (the run recorded in
    papermill_runs/<device>/manifest.json). ``where``: column -> allowed values to filter rows. Returns the frame, or
    None (with a printed reason) when no stored table exists."""
    from hotpaths.harness.env import REPO_ROOT
    from hotpaths.harness.tables import load

    path = REPO_ROOT / "data" / "results" / device / f"{name}.csv"
    if not path.exists():
        print(f"no stored {device} table {name} (expected {path})")
        return None
    df = load(path)
    for col, allowed in (where or {}).items():
        df = df[df[col].isin(list(allowed))]
    print(f"stored {device} results: {path.relative_to(REPO_ROOT)} (run {df['run_id'].iloc[0] if len(df) else '?'})")
    return show(df.reset_index(drop=True), cols=cols)
