"""The report: every published table (data/reported/*) with ours beside it, the tables no publication has, the
figures, and the README's headline tables (generated between markers, never edited by hand).

Inputs are our result tables data/results/<device>/<name>.csv (during ``hotpaths reproduce``, the run's staged
tables first). Every function returns a DataFrame (or a figure); a missing input gives a one-row frame whose
``status`` column says what is missing and how to make it, never an exception.

README blocks: ``<!-- report:NAME:start -->`` ... ``<!-- report:NAME:end -->`` for NAME in HEADLINES, rewritten
by ``python -m hotpaths.bench.report --update-readme`` (or ``hotpaths report --update-readme``);
``--check`` exits 1 when the README differs from what the data generates (tests/test_decode_step.py runs the
same check on CPU).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from hotpaths.harness.env import REPO_ROOT

REPORTED = REPO_ROOT / "data" / "reported"
README = REPO_ROOT / "README.md"
DEFAULT_DEVICE = "h200"
OUR_DECODE = ("dynamic", "static_count", "static_chunk", "batch_invariant", "assign_only")


# ----------------------------------------------------------------------------------------------------------------
# inputs

def result_path(device: str, name: str) -> Path | None:
    """The newest copy of our table ``name`` for ``device``: the staged results of a running ``hotpaths reproduce``
    on that device first, then data/results/<device>/<name>.csv. None when neither exists."""
    cands = []
    staged = os.environ.get("HOTPATHS_RESULTS_DIR")
    if staged:
        from hotpaths.harness.env import device_tag

        if device_tag() == device:
            cands.append(Path(staged) / f"{name}.csv")
    cands.append(REPO_ROOT / "data" / "results" / device / f"{name}.csv")
    return next((p for p in cands if p.exists()), None)


def load_result(device: str, name: str):
    """Our table as a DataFrame, or None when missing (or unreadable)."""
    import pandas as pd

    p = result_path(device, name)
    if p is None:
        return None
    try:
        return pd.read_csv(p)
    except Exception:
        return None


def load_reported(name: str):
    """data/reported/<name>.csv (published figures) as a DataFrame, or None when absent."""
    import pandas as pd

    p = REPORTED / f"{name}.csv"
    return pd.read_csv(p) if p.exists() else None


def missing(what: str, how: str):
    """The one-row frame a section returns when its input is absent."""
    import pandas as pd

    return pd.DataFrame([{"status": f"missing: {what}", "how_to_make_it": how}])


def is_missing(df) -> bool:
    """True for None, an empty frame, or the one-row ``status: missing ...`` frame that ``missing()`` returns."""
    return df is None or len(df) == 0 or (list(df.columns)[:1] == ["status"] and
                                          str(df["status"].iloc[0]).startswith("missing"))


def _rel(p: Path | None) -> str:
    if p is None:
        return "-"
    try:
        return str(p.relative_to(REPO_ROOT))
    except ValueError:
        return str(p)


def _us(df, impl, **where):
    d = df[df["impl"] == impl]
    for k, v in where.items():
        d = d[d[k] == v]
    d = d.dropna(subset=["median_us"])
    return float(d["median_us"].iloc[0]) if len(d) else None


def _first(df, col, **where):
    d = df
    for k, v in where.items():
        d = d[d[k] == v]
    if col not in d.columns:
        return None
    d = d.dropna(subset=[col])
    return d[col].iloc[0] if len(d) else None


def _round(df, nd=2):
    return df.round(nd) if len(df) else df


# ----------------------------------------------------------------------------------------------------------------
# published tables with ours beside them

def decode_vs_peers(device: str = DEFAULT_DEVICE, *, dtype: str = "fp8_kv"):
    """Decode attention by KV distribution (data/reported/decode_fp8_kv_distribution_h20.csv beside
    data/results/<device>/decode_kv_distribution.csv): our dynamic and static split-KV, the best peer measured
    in the same run (and HPC-Ops when measured), % of the copy ceiling and of the read probe (when the table has
    them), the published H20 figures. Times in us."""
    import pandas as pd

    df = load_result(device, "decode_kv_distribution")
    if df is None:
        return missing(f"data/results/{device}/decode_kv_distribution.csv",
                       "notebook 02 (hotpaths reproduce --only 02)")
    df = df[df["dtype"] == dtype] if "dtype" in df.columns else df
    pub = load_reported("decode_fp8_kv_distribution_h20")
    rows = []
    for case in dict.fromkeys(df["case"]):
        d = df[df["case"] == case]
        dyn, stat = _us(d, "dynamic"), _us(d, "static_count")
        peers = {i: _us(d, i) for i in d["impl"].unique() if i not in OUR_DECODE}
        peers = {k: v for k, v in peers.items() if v is not None}
        hpc = {k: v for k, v in peers.items() if k.startswith("hpc_ops")}
        others = {k: v for k, v in peers.items() if not k.startswith("hpc_ops")}
        best = min(others, key=others.get) if others else None
        row = {"case": case, "device": device, "dynamic_us": dyn, "static_us": stat,
               "dynamic_vs_static": stat / dyn if dyn and stat else None,
               "pct_of_ceiling": _first(d, "pct_of_ceiling", impl="dynamic"),
               "pct_of_read_probe": _first(d, "pct_of_read_probe", impl="dynamic"),
               "best_peer": best, "best_peer_us": others.get(best) if best else None,
               # HPC-Ops measured in the same run when it was; else the table's stored H200 reference column
               "hpc_ops_us": min(hpc.values()) if hpc else None,
               "hpc_ops_h200_ref_us": None if hpc else _first(d, "hpc_ops_h200_us", impl="dynamic")}
        if pub is not None and case in set(pub["case"]):
            p = pub[pub["case"] == case].iloc[0]
            row.update(published_h20_dynamic_us=1e3 * p["hpc_dynamic_ms"],
                       published_h20_static_us=1e3 * p["hpc_static_ms"],
                       published_h20_flashinfer_us=1e3 * p["flashinfer_ms"],
                       published_dynamic_vs_static=p["dynamic_vs_static"])
        rows.append(row)
    return _round(pd.DataFrame(rows))


def router_vs_peers(device: str = DEFAULT_DEVICE):
    """Router GEMM (Hy3 N=192, K=4096) by M: our dispatch beside FP32 / TF32 cuBLAS and HPC-Ops (same run when
    measured), % of ceiling, max abs error vs FP64, speedups beside the published H20 speedups (claims.csv via the
    table's published columns). Times in us."""
    import pandas as pd

    df = load_result(device, "router_gemm_latency")
    if df is None:
        return missing(f"data/results/{device}/router_gemm_latency.csv", "notebook 04 (hotpaths reproduce --only 04)")
    rows = []
    for m in sorted(df["m"].dropna().unique()):
        d = df[df["m"] == m]
        ours = _us(d, "dispatch")
        fp32, tf32 = _us(d, "fp32_cublas"), _us(d, "tf32_cublas")
        hpc = [_us(d, i) for i in d["impl"].unique() if str(i).startswith("hpc_ops")]
        hpc = [h for h in hpc if h is not None]
        rows.append({"m": int(m), "device": device, "dispatch_us": ours, "fp32_cublas_us": fp32, "tf32_cublas_us": tf32,
                     "hpc_ops_us": hpc[0] if hpc else None,
                     "hpc_ops_h200_ref_us": None if hpc else _first(d, "hpc_ops_h200_us", impl="dispatch"),
                     "speedup_vs_fp32": fp32 / ours if ours and fp32 else None,
                     "speedup_vs_tf32": tf32 / ours if ours and tf32 else None,
                     "published_h20_speedup_vs_fp32": _first(d, "published_h20_speedup_vs_fp32"),
                     "published_h20_speedup_vs_tf32": _first(d, "published_h20_speedup_vs_tf32"),
                     "pct_of_ceiling": _first(d, "pct_of_ceiling", impl="dispatch"),
                     "pct_of_read_probe": _first(d, "pct_of_read_probe", impl="dispatch"),
                     "max_abs_err_vs_fp64": _first(d, "max_abs_err_vs_fp64", impl="dispatch")})
    out = pd.DataFrame(rows)
    return out.round({c: 2 for c in out.columns if c.endswith("_us") or c.startswith("speedup") or
                      c.startswith("published") or c.startswith("pct")})


def moe_vs_published(device: str = DEFAULT_DEVICE, *, mode: str = "tp8_ep1"):
    """Fused FP8 MoE (Hy3) by (scales, batch): ours and every impl measured in the same run
    (fused_moe_<mode>.csv), % of the read probe, beside the published H20 table (moe_hy3_<mode>_h20.csv, whose
    article does not name its FP8 format: the same published figure stands beside both formats' rows). One row per
    FP8 format and batch, per-tensor first (a table without a ``scales`` column is one format). Times in us."""
    import pandas as pd

    name = f"fused_moe_{mode}"
    df = load_result(device, name)
    if df is None or "batch" not in df.columns:
        return missing(f"data/results/{device}/{name}.csv", "notebook 05 (hotpaths reproduce --only 05)")
    pub = load_reported(f"moe_hy3_{mode}_h20")
    if "model" in df.columns:
        df = df[df["model"].isna() | (df["model"] == "hy3")]
    if "scales" in df.columns:
        order = {"pertensor": 0, "block": 1}
        groups = sorted(((s, b) for s, b in df[["scales", "batch"]].dropna().drop_duplicates().itertuples(index=False)),
                        key=lambda sb: (order.get(sb[0], 2), sb[0], sb[1]))
    else:
        groups = [(None, b) for b in sorted(df["batch"].dropna().unique())]
    rows = []
    for s, b in groups:
        d = df[df["batch"] == b] if s is None else df[(df["batch"] == b) & (df["scales"] == s)]
        row = ({} if s is None else {"scales": s}) | {"batch": int(b), "device": device}
        for impl in dict.fromkeys(d["impl"]):
            us = _us(d, impl)
            if us is not None:
                row[f"{impl}_us"] = us
        row["pct_of_read_probe"] = _first(d, "pct_of_read_probe", impl="fused")
        if pub is not None and int(b) in set(pub["batch"]):
            p = pub[pub["batch"] == int(b)].iloc[0]
            for c in ("hpc_ops_us", "triton_us", "cutlass_us"):
                row[f"published_h20_{c}"] = p[c]
        rows.append(row)
    return _round(pd.DataFrame(rows))


def prologue_vs_peers(device: str = DEFAULT_DEVICE):
    """Attention prologue (fused vs HPC-Ops, FlashInfer, unfused PyTorch) by case from attention_prologue.csv, with
    % of the read probe. No published table exists for it (the articles give no prologue numbers). Times in us."""
    import pandas as pd

    df = load_result(device, "attention_prologue")
    if df is None:
        return missing(f"data/results/{device}/attention_prologue.csv", "notebook 03 (hotpaths reproduce --only 03)")
    rows = []
    for case in dict.fromkeys(df["case"]):
        d = df[df["case"] == case]
        row = {"case": case, "device": device}
        for impl in dict.fromkeys(d["impl"]):
            us = _us(d, impl)
            if us is not None:
                row[f"{impl}_us"] = us
        row["pct_of_read_probe"] = _first(d, "pct_of_read_probe", impl="fused")
        rows.append(row)
    return _round(pd.DataFrame(rows))


def step_tpot(device: str = DEFAULT_DEVICE):
    """The decode-step model's TPOT estimate per batch and configuration beside the published end-to-end TPOT
    reductions (data/reported/e2e_hy3_tpot_8xh20_vllm.csv); see hotpaths.bench.decode_step.NOT_MODELLED."""
    from hotpaths.bench import decode_step as ds

    df = load_result(device, "decode_step")
    if df is None:
        return missing(f"data/results/{device}/decode_step.csv", "notebook 06 or `hotpaths step --save decode_step`")
    return _round(ds.tpot_table(df))


def step_shares(device: str = DEFAULT_DEVICE):
    """Each stage's share of the stored decode-step layer time (decode_step.stage_shares), or the missing frame."""
    from hotpaths.bench import decode_step as ds

    df = load_result(device, "decode_step")
    if df is None:
        return missing(f"data/results/{device}/decode_step.csv", "notebook 06 or `hotpaths step --save decode_step`")
    return _round(ds.stage_shares(df))


# published table -> (the section that puts ours beside it, or None with the reason we have none)
COVERAGE = {
    "decode_fp8_kv_distribution_h20": ("decode_vs_peers", None),
    "moe_hy3_tp8_ep1_h20": ("moe_vs_published(mode='tp8_ep1')", None),
    "moe_hy3_tp1_ep8_h20": ("moe_vs_published(mode='tp1_ep8')", None),
    "e2e_hy3_tpot_8xh20_vllm": ("step_tpot", None),
    "claims": ("router_vs_peers (router rows), decode_vs_peers (speedup claims)", None),
    "attention_prefill_extend_decode_h20": (None, "prefill / extend attention is outside this repository's kernels"),
    "e2e_hy3_ttft_by_batch_8xh20_vllm": (None, "TTFT is prefill-dominated: not modelled (the step model is decode)"),
    "e2e_hy3_ttft_by_input_8xh20_vllm": (None, "TTFT is prefill-dominated: not modelled (the step model is decode)"),
}


def coverage(device: str = DEFAULT_DEVICE):
    """Every published table in data/reported/ with the section that sets ours beside it and whether our side is
    present for ``device``."""
    import pandas as pd

    sections = {"decode_vs_peers": decode_vs_peers, "moe_vs_published(mode='tp8_ep1')": moe_vs_published,
                "moe_vs_published(mode='tp1_ep8')": lambda d: moe_vs_published(d, mode="tp1_ep8"),
                "step_tpot": step_tpot}
    rows = []
    for p in sorted(REPORTED.glob("*.csv")):
        sec, why = COVERAGE.get(p.stem, (None, "no section yet"))
        fn = sections.get(sec)
        status = why if sec is None else ("present" if fn is None or not is_missing(fn(device))
                                          else "ours missing for this device")
        rows.append({"published_table": p.name, "section": sec or "-", "ours": status, "device": device})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------------------------------------
# tables no publication has

def router_flip_rates(device: str = DEFAULT_DEVICE):
    """Top-8 routing flips per numeric path (router_gemm_flips.csv): natural scores and near ties by gap."""
    df = load_result(device, "router_gemm_flips")
    if df is None:
        return missing(f"data/results/{device}/router_gemm_flips.csv", "notebook 04")
    cols = [c for c in ("case", "impl", "gap", "median_gap", "flip_rate", "flips", "weight_moved_max") if c in df]
    return df[cols].reset_index(drop=True)


def batch_invariance_cost(device: str = DEFAULT_DEVICE, *, dtype: str = "fp8_kv"):
    """What bit-identical-whatever-the-batch decode costs: the batch_invariant mode over dynamic per case."""
    import pandas as pd

    df = load_result(device, "decode_kv_distribution")
    if df is None:
        return missing(f"data/results/{device}/decode_kv_distribution.csv", "notebook 02")
    df = df[df["dtype"] == dtype] if "dtype" in df.columns else df
    rows = []
    for case in dict.fromkeys(df["case"]):
        d = df[df["case"] == case]
        dyn, inv = _us(d, "dynamic"), _us(d, "batch_invariant")
        if dyn and inv:
            rows.append({"case": case, "dynamic_us": dyn, "batch_invariant_us": inv,
                         "cost_pct": 100.0 * (inv - dyn) / dyn})
    return _round(pd.DataFrame(rows)) if rows else missing("batch_invariant rows", "notebook 02 (full profile)")


def scheduling_sim_accuracy():
    """How well the CPU scheduling simulator predicts measured decode times (data/results/cpu/
    split_kv_scheduling_sim.csv, notebook 01): rows with a measurement, and the mean |relative error| per impl."""
    import pandas as pd

    p = REPO_ROOT / "data" / "results" / "cpu" / "split_kv_scheduling_sim.csv"
    if not p.exists():
        return missing(_rel(p), "notebook 01")
    df = pd.read_csv(p)
    if "rel_err" not in df.columns or df["rel_err"].isna().all():
        return missing("measured rows (rel_err) in " + _rel(p), "notebook 01 with stored H200 timings")
    d = df.dropna(subset=["rel_err"])
    g = d.groupby("impl").agg(cases=("case", "count"), mean_abs_rel_err=("rel_err", lambda s: s.abs().mean()),
                              max_abs_rel_err=("rel_err", lambda s: s.abs().max())).reset_index()
    return _round(g, 3)


def accuracy_beside_speed(device: str = DEFAULT_DEVICE):
    """One row per op, impl and dtype (the KV or FP8 format: a bf16 KV's error is not an FP8 one's): the median
    time range beside the worst error vs exact (rel L2 / max abs / cosine) over the table's rows."""
    import pandas as pd

    rows = []
    for name in ("decode_kv_distribution", "router_gemm_latency", "fused_moe_tp8_ep1", "attention_prologue"):
        df = load_result(device, name)
        if df is None:
            rows.append({"table": name, "status": "missing"})
            continue
        keys = ["impl", "dtype"] if "dtype" in df.columns else ["impl"]
        for key, d in df.groupby([df[k].fillna("") for k in keys], sort=False):
            impl, dtype = (key[0], key[1] or None) if len(keys) == 2 else (key[0], None)
            errs = {c: d[c].dropna().max() if c in d and d[c].notna().any() else None
                    for c in ("rel_l2_err", "max_abs_err", "cosine")}
            if "cosine" in d and d["cosine"].notna().any():
                errs["cosine"] = d["cosine"].dropna().min()
            rows.append({"table": name, "impl": impl, "dtype": dtype, "median_us_range":
                         f"{d['median_us'].min():.1f}-{d['median_us'].max():.1f}" if d["median_us"].notna().any()
                         else None, "worst_rel_l2_err": errs["rel_l2_err"], "worst_max_abs_err": errs["max_abs_err"],
                         "worst_cosine": errs["cosine"]})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------------------------------------
# figures

def fig_latency_vs_batch(device: str = DEFAULT_DEVICE):
    """Latency per op with peers: router vs M, MoE vs batch (with the published H20 points), decode per case.
    Returns the figure (panels without data say so)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    r = load_result(device, "router_gemm_latency")
    ax = axes[0]
    if r is not None:
        for impl, d in r.groupby("impl"):
            d = d.dropna(subset=["median_us"]).sort_values("m")
            ax.plot(d["m"], d["median_us"], "o-", ms=3, label=impl)
        ax.set_xscale("log", base=2)
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "router table missing", ha="center", transform=ax.transAxes)
    ax.set(title=f"router GEMM N=192 K=4096 ({device})", xlabel="M", ylabel="us")
    m = load_result(device, "fused_moe_tp8_ep1")
    ax = axes[1]
    if m is not None and "batch" in m.columns:
        if "model" in m.columns:
            m = m[m["model"].isna() | (m["model"] == "hy3")]
        keys = ["impl", "scales"] if "scales" in m.columns else ["impl"]
        for key, d in m.groupby(keys):
            key = key if isinstance(key, tuple) else (key,)
            d = d.dropna(subset=["median_us"]).sort_values("batch")
            if len(d):  # one line per impl and FP8 format: the two formats' times never share a line
                ax.plot(d["batch"], d["median_us"], "o-" if key[-1] != "block" else "s--", ms=3,
                        label=" ".join(str(k) for k in key))
        pub = load_reported("moe_hy3_tp8_ep1_h20")
        if pub is not None:
            ax.plot(pub["batch"], pub["hpc_ops_us"], "k^:", label="published HPC-Ops (H20)")
        ax.set_xscale("log", base=2)
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "MoE table missing (notebook 05)", ha="center", transform=ax.transAxes)
    ax.set(title=f"fused MoE Hy3 TP8/EP1 ({device})", xlabel="batch", ylabel="us")
    dec = decode_vs_peers(device)
    ax = axes[2]
    if not is_missing(dec):
        import numpy as np

        if "hpc_ops_us" in dec and dec["hpc_ops_us"].isna().all() and "hpc_ops_h200_ref_us" in dec:
            dec = dec.assign(hpc_ops_us=dec["hpc_ops_h200_ref_us"])

        x = np.arange(len(dec))
        for j, (col, lab) in enumerate((("dynamic_us", "dynamic"), ("static_us", "static"),
                                        ("best_peer_us", "best peer (same run)"), ("hpc_ops_us", "HPC-Ops"))):
            if col in dec and dec[col].notna().any():
                ax.bar(x + 0.2 * j - 0.3, dec[col].astype(float), width=0.2, label=lab)
        ax.set_xticks(x, dec["case"], rotation=45, ha="right", fontsize=7)
        ax.set_yscale("log")
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "decode table missing", ha="center", transform=ax.transAxes)
    ax.set(title=f"decode FP8 KV by case ({device})", ylabel="us")
    fig.tight_layout()
    return fig


def fig_stage_shares(device: str = DEFAULT_DEVICE):
    """Stacked stage times of the decode step (None when there is no step table)."""
    from hotpaths.bench import decode_step as ds

    sh = step_shares(device)
    if is_missing(sh):
        return None
    ax = ds.plot_stage_shares(sh)
    return None if ax is None else ax.figure


# The tables notebook 07 saves as report_<name> (reporting on the tables of its ``device``), by name: the staleness
# test recomputes every committed report_<name>.csv from these and the stored tables it was made from.
REPORT_TABLES = {
    "coverage": coverage,
    "decode": decode_vs_peers,
    "router": router_vs_peers,
    "moe_tp8_ep1": lambda device: moe_vs_published(device, mode="tp8_ep1"),
    "moe_tp1_ep8": lambda device: moe_vs_published(device, mode="tp1_ep8"),
    "prologue": prologue_vs_peers,
    "step_tpot": step_tpot,
    "router_flips": router_flip_rates,
    "batch_invariance": batch_invariance_cost,
    "scheduling_sim": lambda device: scheduling_sim_accuracy(),
    "accuracy": accuracy_beside_speed,
}


# ----------------------------------------------------------------------------------------------------------------
# README headline tables

def _headline(df, cols: list[str]):
    keep = [c for c in cols if c in df.columns and df[c].notna().any()]
    return df[keep]


def headline_decode(device):
    """The README's decode block: decode_vs_peers narrowed to its headline columns."""
    df = decode_vs_peers(device)
    return df if is_missing(df) else _headline(df, ["case", "dynamic_us", "static_us", "dynamic_vs_static",
                                                     "best_peer", "best_peer_us", "hpc_ops_us", "hpc_ops_h200_ref_us",
                                                     "pct_of_ceiling",
                                                     "pct_of_read_probe", "published_h20_dynamic_us",
                                                     "published_dynamic_vs_static"])


def headline_router(device):
    """The README's router block: router_vs_peers narrowed to its headline columns."""
    df = router_vs_peers(device)
    return df if is_missing(df) else _headline(df, ["m", "dispatch_us", "fp32_cublas_us", "tf32_cublas_us",
                                                     "hpc_ops_us", "hpc_ops_h200_ref_us", "speedup_vs_fp32",
                                                     "published_h20_speedup_vs_fp32",
                                                     "max_abs_err_vs_fp64", "pct_of_read_probe"])


def headline_moe(device):
    """The README's MoE block: moe_vs_published without the device column."""
    df = moe_vs_published(device)
    return df if is_missing(df) else df.drop(columns=["device"], errors="ignore")


def headline_step(device):
    """The README's decode-step block: step_tpot narrowed to its headline columns."""
    df = step_tpot(device)
    return df if is_missing(df) else _headline(df, ["lengths", "batch", "baseline_layer_us", "hotpaths_layer_us",
                                                     "hpc_ops_layer_us", "hotpaths_tpot_ms", "hotpaths_reduction_pct",
                                                     "published_reduction_pct", "pdl_saves_us"])


HEADLINES = {
    "decode": ("Decode attention, FP8 KV, by KV distribution (us)", headline_decode, "decode_kv_distribution"),
    "router": ("Router GEMM, Hy3 N=192 K=4096, by M (us)", headline_router, "router_gemm_latency"),
    "moe": ("Fused FP8 MoE, Hy3 TP8/EP1, by FP8 format and batch (us)", headline_moe, "fused_moe_tp8_ep1"),
    "step": ("Decode step, one Hy3 layer per GPU (TP8), TPOT estimate", headline_step, "decode_step"),
}


def headline_markdown(name: str, device: str = DEFAULT_DEVICE) -> str:
    """The Markdown a README block holds: a caption naming the device and source table, then the table, or the
    empty-state sentence when the table does not exist yet. Deterministic for the same data."""
    from hotpaths.harness.tables import to_markdown

    if name not in HEADLINES:
        raise ValueError(f"name must be one of {sorted(HEADLINES)}, got {name!r}")
    title, fn, table = HEADLINES[name]
    df = fn(device)
    src = f"data/results/{device}/{table}.csv"
    if is_missing(df):
        return f"*{title}: no {device} table yet ({src} is made by {df['how_to_make_it'].iloc[0]}).*\n"
    cap = f"*{title}. Device: {device}; source: `{src}`; published H20 figures beside ours where they exist."
    if "hpc_ops_h200_ref_us" in df.columns:
        cap += " hpc_ops_h200_ref_us: HPC-Ops' H200 time stored with the table, not measured in the same run."
    return cap + "*\n\n" + to_markdown(df.reset_index(drop=True))


def _block_re(name: str):
    return re.compile(rf"(<!-- report:{re.escape(name)}:start -->\n)(.*?)(<!-- report:{re.escape(name)}:end -->)",
                      re.S)


def render_readme(text: str, device: str = DEFAULT_DEVICE) -> str:
    """``text`` with every report block rewritten from the data (blocks absent from the text are left absent)."""
    for name in HEADLINES:
        rx = _block_re(name)
        if rx.search(text):
            body = headline_markdown(name, device)
            text = rx.sub(lambda m, b=body: m.group(1) + "\n" + b + "\n" + m.group(3), text)
    return text


def readme_blocks(text: str) -> list[str]:
    """Names of the HEADLINES blocks whose report markers the README text holds."""
    return [n for n in HEADLINES if _block_re(n).search(text)]


def update_readme(path: Path = README, device: str = DEFAULT_DEVICE, *, check: bool = False) -> list[str]:
    """Regenerate the README's report blocks. Returns the names of blocks whose text changed (with check=True
    nothing is written: a non-empty list means the README is stale)."""
    old = Path(path).read_text()
    new = render_readme(old, device)
    changed = []
    for n in readme_blocks(old):
        if _block_re(n).search(old).group(2) != _block_re(n).search(new).group(2):
            changed.append(n)
    if changed and not check:
        Path(path).write_text(new)
    return changed


def _cmd_report(args) -> int:
    if args.update_readme or args.check:
        changed = update_readme(Path(args.readme), args.device, check=args.check)
        if args.check:
            print("README report blocks up to date" if not changed else f"README report blocks stale: {changed} "
                  "(run `python -m hotpaths.bench.report --update-readme`)")
            return 1 if changed else 0
        print(f"README report blocks rewritten: {changed or 'none changed'}")
        return 0
    from hotpaths.harness.tables import to_markdown

    for title, fn in (("coverage", coverage), ("decode vs peers", decode_vs_peers), ("router", router_vs_peers),
                      ("MoE", moe_vs_published), ("prologue", prologue_vs_peers), ("decode step TPOT", step_tpot)):
        print(f"## {title}\n\n{to_markdown(fn(args.device))}")
    return 0


def _add_args(p) -> None:
    p.add_argument("--device", default=DEFAULT_DEVICE, help="which data/results/<device>/ (default h200)")
    p.add_argument("--update-readme", action="store_true", help="rewrite the README's report blocks")
    p.add_argument("--check", action="store_true", help="exit 1 if the README's report blocks are stale")
    p.add_argument("--readme", default=str(README), help=argparse.SUPPRESS)
    p.set_defaults(func=_cmd_report)


def register(subparsers) -> None:
    """``hotpaths report``: the report tables, or --update-readme / --check for the README blocks."""
    p = subparsers.add_parser("report", help="the report tables; --update-readme rewrites the README blocks",
                              description="Prints every published table with ours beside it from "
                              "data/results/<device>/; --update-readme regenerates the README's headline blocks "
                              "(between <!-- report:NAME:start/end --> markers); --check exits 1 when stale.")
    _add_args(p)


def main(argv=None) -> int:
    """``python -m hotpaths.bench.report``: the same options as ``hotpaths report``; the exit status."""
    p = argparse.ArgumentParser(prog="python -m hotpaths.bench.report")
    _add_args(p)
    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
