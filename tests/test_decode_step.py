"""Decode-step model and report on CPU: the continuous-batching lengths, the TPOT and stage arithmetic on stored /
synthetic step tables, the `hotpaths step` CLI, the report's missing-input behaviour, and the README blocks
generated from data/results/h200/ (a hand edit between the markers fails here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from hotpaths.bench import decode_step as ds
from hotpaths.bench import report

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------------------------------
# lengths

def test_trace_names_and_case_strings():
    assert ds.trace_of("8k4k").name == "8k4k"
    t = ds.trace_of("2x1K+1x64", out_tokens=5)
    assert {c[1] for c in t.classes} == {1024, 64} and all(c[3] == c[4] == 5 for c in t.classes)
    assert abs(sum(c[0] for c in t.classes) - 1) < 1e-12
    with pytest.raises(ValueError, match="lengths"):
        ds.trace_of("lots of tokens")


def test_continuous_batch_grows_by_one_and_refills_finished_slots():
    sched = ds.ContinuousBatch(ds.trace_of("4x100+4x300", out_tokens=6), 8, seed=3)
    prev, prev_left = sched.lengths().copy(), sched.left.copy()
    joined_total = 0
    for _ in range(20):
        cur = sched.advance()
        cont = prev_left > 1  # requests still running after this step
        assert np.array_equal(cur[cont], prev[cont] + 1), "a running request's KV must grow by exactly one"
        new = ~cont
        assert set(cur[new].tolist()) <= {100, 300}, "a joining request starts at its prompt length"
        joined_total += int(new.sum())
        assert cur.dtype == np.int32 and cur.shape == (8,)
        assert cur.max() < sched.max_kv_len
        prev, prev_left = cur.copy(), sched.left.copy()
    assert sched.finished == sched.joined == joined_total > 8  # 6-token outputs: every slot turned over


def test_continuous_batch_is_seeded_and_steady_state():
    a = ds.ContinuousBatch(ds.LENGTH_TRACES["8k4k"], 64, seed=1)
    b = ds.ContinuousBatch(ds.LENGTH_TRACES["8k4k"], 64, seed=1)
    for _ in range(5):
        assert np.array_equal(a.advance(), b.advance())
    L = a.lengths()
    assert L.min() >= 8 * 1024 and L.max() <= 16 * 1024
    assert len(set(a.left.tolist())) > 32, "slots start at spread points of their output (finishes spread out)"
    ag = ds.ContinuousBatch(ds.LENGTH_TRACES["agentic"], 256, seed=0)
    assert ag.lengths().min() < 8 * 1024 < 64 * 1024 < ag.lengths().max(), "the agentic mix spans short and long"
    with pytest.raises(ValueError, match="batch"):
        ds.ContinuousBatch(ds.LENGTH_TRACES["8k4k"], 0)


# ---------------------------------------------------------------------------------------------------------------
# arithmetic on step tables

def _step_rows(batch=8, lengths="8k4k"):
    rows = []
    layer = {"baseline": 200.0, "hotpaths": 150.0, "hotpaths_nopdl": 156.0, "hpc_ops": 160.0}
    stages = {"qkv": 10.0, "meta": 5.0, "prologue": 10.0, "attention": 50.0, "o_proj": 10.0, "router": 10.0,
              "topk": 5.0, "moe": 60.0}
    for impl, us in layer.items():
        rows.append({"impl": impl, "stage": "step", "median_us": us, "batch": batch, "lengths": lengths})
        for st, s_us in stages.items():
            rows.append({"impl": impl, "stage": st, "median_us": s_us * us / 160.0, "batch": batch,
                         "lengths": lengths})
    return pd.DataFrame(rows)


def test_tpot_arithmetic():
    assert ds.tpot_ms(100.0, 80) == pytest.approx(8.0)
    assert ds.tpot_ms(12.5) == pytest.approx(12.5 * ds.HY3_TP8.layers / 1000)
    with pytest.raises(ValueError):
        ds.tpot_ms(1.0, 0)
    tp = ds.tpot_table(_step_rows(batch=8), layers=80)
    r = tp.iloc[0]
    assert r["hotpaths_tpot_ms"] == pytest.approx(12.0) and r["baseline_tpot_ms"] == pytest.approx(16.0)
    assert r["hotpaths_reduction_pct"] == pytest.approx(25.0)
    assert r["hpc_ops_reduction_pct"] == pytest.approx(20.0)
    assert r["pdl_saves_us"] == pytest.approx(6.0)
    pub = ds.published_tpot()
    assert r["published_reduction_pct"] == pytest.approx(float(pub[pub.batch_size == 8].improvement_pct.iloc[0]))
    assert "published_reduction_pct" not in ds.tpot_table(_step_rows(batch=3)).columns  # no published batch 3


def test_stage_shares_compose_the_step():
    sh = ds.stage_shares(_step_rows())
    assert list(sh[sh.impl == "hotpaths"]["stage"]) == list(ds.STAGES)
    for _, g in sh.groupby("impl"):
        assert g["share_pct"].sum() == pytest.approx(100.0)
        assert g["stage_us"].sum() == pytest.approx(g["sum_of_stages_us"].iloc[0])
    hp = sh[sh.impl == "hotpaths"]
    assert hp["sum_of_stages_us"].iloc[0] == pytest.approx(160.0 * 150 / 160)
    ax = ds.plot_stage_shares(sh)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(ds.STAGES)
    # one stacked bar per config, in CONFIGS order, whose top is that config's sum of stages
    tops = {}
    for bar in ax.patches:
        tops[bar.get_x()] = tops.get(bar.get_x(), 0.0) + bar.get_height()
    want = [float(sh[sh.impl == i]["stage_us"].sum()) for i in ds.CONFIGS if (sh.impl == i).any()]
    assert [tops[x] for x in sorted(tops)] == pytest.approx(want)
    assert ds.plot_stage_shares(sh.iloc[:0]) is None


def test_stored_fallback_is_labelled(tmp_path, monkeypatch):
    p = tmp_path / "decode_step.csv"
    _step_rows(batch=8).to_csv(p, index=False)
    monkeypatch.setattr(ds, "stored_path", lambda device="h200", name=ds.STORED_NAME: p)
    monkeypatch.setattr(ds, "REPO_ROOT", tmp_path)
    df = ds.stored_rows()
    assert df is not None and set(df["source"]) == {"stored:decode_step.csv"}

    class Args:
        batch, lengths, config, steps, iters, seed, no_stages, json = "8", "8k4k", "baseline,hotpaths", 4, 5, 0, 0, 1
        device_table = "h200"
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the CLI measures instead of reading the stored table")
    rows, source = ds._rows_or_stored(Args)
    assert source.startswith("stored H200 rows") and {r["impl"] for r in rows} == {"baseline", "hotpaths",
                                                                                   "hotpaths_nopdl"}
    Args.batch = "64"
    rows, source = ds._rows_or_stored(Args)
    assert rows is None and "no rows" in source


# ---------------------------------------------------------------------------------------------------------------
# CLI

def _cli(*args):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # the CPU path (the stored table) even on a GPU machine
    return subprocess.run([sys.executable, "-m", "hotpaths", *args], capture_output=True, text=True, env=env,
                          timeout=300, cwd=ROOT)


def test_cli_step_on_cpu_uses_the_stored_table_or_says_there_is_none():
    r = _cli("step", "--batch", "1,8", "--lengths", "8k4k", "--json")
    if ds.stored_path().exists():
        assert r.returncode == 0, r.stderr
        assert '"op": "decode_step"' in r.stdout
    else:
        assert r.returncode == 1
        assert "no stored table" in r.stdout and "decode_step.csv" in r.stdout


def test_cli_step_rejects_bad_arguments():
    r = _cli("step", "--config", "baseline,fastest")
    assert r.returncode == 2 and "--config" in r.stderr and "fastest" in r.stderr
    r = _cli("step", "--lengths", "many")
    assert r.returncode == 2 and "lengths" in r.stderr
    r = _cli("step", "--batch", "0")
    assert r.returncode == 2 and "--batch" in r.stderr


def test_cli_lists_step_and_report():
    r = _cli("--help")
    assert r.returncode == 0 and " step " in r.stdout.replace("\n", " ") and "report" in r.stdout


# ---------------------------------------------------------------------------------------------------------------
# report and README

def test_readme_blocks_match_the_data():
    """The README's generated tables equal what data/results/h200/ generates (no hand edits, no stale data)."""
    text = (ROOT / "README.md").read_text()
    blocks = report.readme_blocks(text)
    assert len(blocks) >= 2, "README lost its report markers"
    stale = report.update_readme(ROOT / "README.md", check=True)
    assert not stale, f"README blocks {stale} differ from the data: run python -m hotpaths.bench.report --update-readme"


def test_render_readme_replaces_only_marked_blocks(tmp_path):
    text = ("intro\n<!-- report:router:start -->\nhand-edited\n<!-- report:router:end -->\n"
            "<!-- report:moe:start -->\n<!-- report:moe:end -->\nend\n")
    out = report.render_readme(text, device="no_such_device")
    assert "hand-edited" not in out and out.startswith("intro\n") and out.endswith("end\n")
    assert "no no_such_device table yet" in out
    p = tmp_path / "README.md"
    p.write_text(text)
    assert report.update_readme(p, device="no_such_device", check=True) == ["router", "moe"]
    assert p.read_text() == text  # check mode writes nothing
    report.update_readme(p, device="no_such_device")
    assert report.update_readme(p, device="no_such_device", check=True) == []


def test_report_sections_report_missing_inputs():
    for fn in (report.decode_vs_peers, report.router_vs_peers, report.moe_vs_published, report.prologue_vs_peers,
               report.step_tpot, report.router_flip_rates, report.batch_invariance_cost):
        df = fn("no_such_device")
        assert report.is_missing(df), fn.__name__
        assert "no_such_device" in df["status"].iloc[0]
    cov = report.coverage("no_such_device")
    assert set(cov["published_table"]) == {p.name for p in (ROOT / "data" / "reported").glob("*.csv")}
    acc = report.accuracy_beside_speed("no_such_device")
    assert set(acc["status"]) == {"missing"}


def test_report_on_stored_h200_tables():
    dec = report.decode_vs_peers("h200")
    assert not report.is_missing(dec), "data/results/h200 is committed: its decode table must load"
    row = dec[dec.case == "1x128K+31x4K"].iloc[0]
    assert row["dynamic_vs_static"] == pytest.approx(row["static_us"] / row["dynamic_us"], rel=0.01)
    assert row["published_h20_dynamic_us"] == pytest.approx(63.0)
    inv = report.batch_invariance_cost("h200")
    if not report.is_missing(inv):
        assert (inv["batch_invariant_us"] > 0).all()
    fig = report.fig_latency_vs_batch("h200")
    assert len(fig.axes) == 3


def test_committed_report_tables_match_their_sources():
    """Every committed report_<name>.csv equals what notebook 07's section computes now from the stored tables it
    reports on (the device its title names): a report left behind when notebook 05 or 02 was re-run alone fails."""
    import io
    import re

    from hotpaths.harness.tables import normalize

    files = sorted((ROOT / "data" / "results").glob("*/report_*.csv"))
    assert files, "notebook 07's report tables are committed (data/results/cpu/report_*.csv)"
    for f in files:
        name = f.stem[len("report_"):]
        assert name in report.REPORT_TABLES, f"{f}: no section named {name!r} in report.REPORT_TABLES"
        m = re.search(r"\((\w+)\)\s*$", f.with_suffix(".md").read_text().splitlines()[0])
        assert m, f"{f.with_suffix('.md')}: the title names no device"
        buf = io.StringIO()
        normalize(report.REPORT_TABLES[name](m.group(1))).to_csv(buf, index=False, float_format="%.6g",
                                                                  lineterminator="\n")
        assert buf.getvalue() == f.read_text(), (f"{f.relative_to(ROOT)} is stale: re-run notebook 07 "
                                                 "(hotpaths reproduce --only 07 --device cpu)")


def test_moe_report_keeps_the_fp8_formats_apart():
    """One report row per (scales, batch), each time the one row of the stored table with that format and batch:
    a row made of the first match per batch mixed per-tensor and block-wise times."""
    import pandas as pd

    stored = pd.read_csv(ROOT / "data" / "results" / "h200" / "fused_moe_tp8_ep1.csv")
    stored = stored[stored["model"].isna() | (stored["model"] == "hy3")]
    rep = report.moe_vs_published("h200")
    assert not report.is_missing(rep)
    assert set(rep["scales"]) == set(stored["scales"].dropna()) == {"pertensor", "block"}
    assert list(rep["scales"]).index("block") == int((rep["scales"] == "pertensor").sum())  # per-tensor first
    assert not rep.duplicated(["scales", "batch"]).any()
    for r in rep.itertuples():
        want = stored[(stored.scales == r.scales) & (stored.batch == r.batch) & (stored.impl == "fused")]
        assert r.fused_us == pytest.approx(float(want["median_us"].iloc[0]), abs=0.006)
    head = report.headline_moe("h200")
    assert "scales" in head.columns and "device" not in head.columns


# ---------------------------------------------------------------------------------------------------------------
# the baseline's PyTorch stages composed on CPU (a dense stand-in for FlashInfer's XQA, a small layer)

def _dense_xqa(q, kv, ws, bt, seq, max_len, bmm1_scale, bmm2_scale, out, kv_layout, backend):
    import torch

    kc, vc = kv
    ps = kc.shape[1]
    for r in range(q.shape[0]):
        L = int(seq[r])
        pages = bt[r, : -(-L // ps)].long()
        k = kc[pages].reshape(-1, kc.shape[3])[:L].float()
        v = vc[pages].reshape(-1, kc.shape[3])[:L].float()
        out[r] = (torch.softmax(q[r].float() @ k.t() * bmm1_scale, -1) @ v * bmm2_scale).to(out.dtype)


def test_baseline_stages_compose_on_cpu(monkeypatch):
    import types

    import torch
    import torch.nn.functional as F

    if not hasattr(torch, "_grouped_mm"):
        pytest.skip(f"torch {torch.__version__} has no _grouped_mm")
    fi = types.ModuleType("flashinfer")
    dec = types.ModuleType("flashinfer.decode")
    dec.trtllm_batch_decode_with_kv_cache = _dense_xqa
    monkeypatch.setitem(sys.modules, "flashinfer", fi)
    monkeypatch.setitem(sys.modules, "flashinfer.decode", dec)
    monkeypatch.setattr(ds, "_import_flashinfer", lambda: fi)
    small = ds.LayerShape(experts=64, hidden=256, inter=64, shared_inter=64)
    sched = ds.ContinuousBatch(ds.trace_of("3x100+1x300", out_tokens=2), 4, seed=0)
    # flashinfer is stubbed above: nothing the baseline needs is missing, so StepUnavailable here is a failure
    m = ds.StepModel.build("baseline", 4, sched.lengths(), max_kv_len=sched.max_kv_len, shape=small, device="cpu")
    t = m.t
    for _ in range(3):
        ctx = sched.advance()
        m.set_lengths(ctx)
        m.step()
        assert t["kv_lens"].tolist() == (ctx + 1).tolist()
        pos = t["positions"].long()
        assert torch.equal(t["slots"], t["block_table"].long().gather(1, (pos // 64)[:, None])[:, 0] * 64 + pos % 64)
    # the new token's K and V are in the cache at its slot (norm -> RoPE -> FP8, as the exact prologue), and the
    # attention output is the softmax over ctx + 1 tokens that include it
    from hotpaths.reference.attention_prologue import attention_prologue_ref

    _, k, v = attention_prologue_ref(t["qkv"], t["q_norm_w"], t["k_norm_w"], t["cos_sin"], t["positions"], kv_heads=1,
                                     eps=small.eps)
    kc = t["k_cache"].view(-1, 1, small.head_dim)[t["slots"]].double()
    vc = t["v_cache"].view(-1, 1, small.head_dim)[t["slots"]].double()
    assert float((kc - k).norm() / k.norm()) < 0.05 and float((vc - v).norm() / v.norm()) < 0.05  # e4m3 rounding
    assert torch.isfinite(t["attn"].float()).all() and torch.isfinite(t["out"].float()).all()
    # the MoE equals a per-token loop over the selected experts on the same dequantized weights (+ shared expert)
    o, ref = t["o"].float(), t["shared_out"].float().clone()
    for i in range(4):
        for j in range(small.topk):
            e, w = int(t["topk_ids"][i, j]), float(t["topk_w"][i, j])
            w13 = (t["w13"][e].float() * t["w13_scale"][e]).to(torch.bfloat16).float()
            w2 = (t["w2"][e].float() * t["w2_scale"][e]).to(torch.bfloat16).float()
            gu = o[i] @ w13.t()
            ref[i] += w * ((F.silu(gu[: small.inter]) * gu[small.inter:]) @ w2.t())
    assert float((t["out"].float() - ref).norm() / ref.norm()) < 1e-2
    # top-k weights: softmax over the selected logits, ids the k largest scores
    top = torch.topk(t["scores"], small.topk, dim=-1)
    assert torch.equal(t["topk_ids"].long(), top.indices)
    assert torch.allclose(t["topk_w"].sum(-1), torch.ones(4))
