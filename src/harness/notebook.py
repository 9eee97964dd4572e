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
