"""CPU tests of the attention-prologue benchmark: the request layout, the table rows with the emulation fallback,
the torch unfused peer against the emulation, and the ``hotpaths prologue`` command line (JSON rows, bad flags exit
2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hotpaths.bench import attention_prologue as bap
from hotpaths.bench import attention_prologue_peers as peers
from hotpaths.harness.env import has_sm90
from hotpaths.harness.tables import COLUMNS
from hotpaths.reference import attention_prologue as ref

cpu_only = pytest.mark.skipif(has_sm90(), reason="the emulation fallback is what a machine without SM90 runs")


def _cli(*args):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__import__("hotpaths").__file__).parent.parent)] +
                                        ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["CUDA_VISIBLE_DEVICES"] = ""
    return subprocess.run([sys.executable, "-m", "hotpaths", "prologue", *args], capture_output=True, text=True,
                          env=env, timeout=300)


@pytest.mark.parametrize("mode,T,q_len", [("decode", 12, 1), ("decode", 12, 4), ("prefill", 200, 1)])
def test_request_layout_is_consistent(mode, T, q_len):
    lay = bap.request_layout(T, mode, 16, q_len=q_len, seed=1)
    pos, slots, bt = lay["positions"], lay["slot_mapping"], lay["block_table"]
    assert pos.shape == slots.shape == (T,)
    assert len(set(slots.tolist())) == T and int(slots.min()) >= 0 and int(slots.max()) < lay["num_pages"] * 16
    qi, lens = lay["q_indptr"].tolist(), lay["seq_lens"].tolist()
    assert qi[-1] == T and len(qi) == len(lens) + 1
    for r, L in enumerate(lens):
        for i, t in enumerate(range(qi[r], qi[r + 1])):
            p = L - (qi[r + 1] - qi[r]) + i
            assert int(pos[t]) == p
            assert int(slots[t]) == int(bt[r, p // 16]) * 16 + p % 16
    assert lay["is_prefill"] == (mode == "prefill")


def test_request_layout_rejects_bad_q_len():
    with pytest.raises(ValueError, match="multiple of q_len"):
        bap.request_layout(7, "decode", 64, q_len=2)


@cpu_only
def test_rows_fall_back_to_emulation_untimed():
    rows = bap.prologue_rows([1, 300], check=True)
    impls = {r["impl"] for r in rows}
    assert impls == {"fused_emulation", "torch_unfused_emulation", "torch_unfused_graph_emulation", "hpc_ops",
                     "flashinfer_fused"}
    for r in rows:
        assert r.get("median_us") is None
        assert r["case"] == bap.case_name(8, 1, "decode" if r["tokens"] <= 256 else "prefill", r["tokens"])
        if r["impl"].endswith("_emulation"):
            assert r["rel_l2_err"] < 4e-2 and r["k_rel_l2_err"] < 4e-2
        else:
            assert "needs a CUDA GPU" in r["note"]
    # the unfused torch sequence rounds differently (torch's reductions, rsqrt): the check counts it
    tu = [r for r in rows if r["impl"] == "torch_unfused_emulation"]
    assert all(isinstance(r["q_mismatch"], int) and r["cache_mismatch"] >= 0 for r in tu)


def test_torch_unfused_peer_matches_emulation_closely():
    inp = bap.make_bench_inputs(48, mode="decode", q_heads=8, kv_heads=2, head_dim=64, page_size=16,
                                rope="interleaved", norm_order="rope_norm", rotary_dim=32)
    want = ref.attention_prologue_emulation(*(inp[k] for k in bap.OP_ARGS), **{k: inp[k] for k in bap.OP_KW})
    fn = peers.make_torch_unfused(inp, allow_cpu=True)
    q, qs, kc, vc = fn()
    assert torch.allclose(qs, want[1], rtol=1e-5)
    qd, wd = q.float() * qs[..., None], want[0].float() * want[1][..., None]
    assert float((qd - wd).norm() / wd.norm()) < 2e-2  # same math, other rounding: a few FP8 flips
    written = ref.written_mask(inp["slot_mapping"], kc.shape[0], kc.shape[1])
    assert (kc.view(torch.uint8)[~written] == 0x7F).all()  # untouched slots keep their poison
    assert not (kc.view(torch.uint8)[written] == 0x7F).any()


def test_gpu_peers_give_reasons_on_cpu():
    inp = bap.make_bench_inputs(4)
    for name in ("hpc_ops", "flashinfer_fused", "torch_unfused"):
        fn, reason = peers.try_make(name, inp)
        assert fn is None and ("needs a CUDA GPU" in reason or "inputs are on cpu" in reason)
    fn, reason = peers.try_make("nope", inp)
    assert fn is None and "unknown peer" in reason


def test_cli_json_rows():
    p = _cli("--tokens", "1,7", "--q-heads", "8", "--kv-heads", "1", "--head-dim", "128", "--page-size", "64",
             "--norm-order", "rope_norm", "--rope", "interleaved", "--kv-dtype", "bf16", "--impl", "fused,hpc_ops",
             "--check", "--json")
    assert p.returncode == 0, p.stderr
    rows = [json.loads(line) for line in p.stdout.splitlines() if line.strip()]
    assert len(rows) == 4
    assert list(rows[0])[:len(COLUMNS)] == COLUMNS
    fused = [r for r in rows if r["impl"] == "fused_emulation"]
    assert [r["case"] for r in fused] == ["8q1kv-decode-1", "8q1kv-decode-7"]
    assert all(r["median_us"] is None and r["dtype"] == "q bf16, kv bf16" for r in fused)
    assert all(r["rel_l2_err"] < 2.5e-3 for r in fused)  # bf16 Q: one rounding
    assert all("--rope interleaved" in r["repro"] for r in rows)
    hp = [r for r in rows if r["impl"] == "hpc_ops"]
    assert all(r["note"] for r in hp)


def test_cli_chain_without_gpu_says_why():
    p = _cli("--chain", "64x0.5K", "--json")
    assert p.returncode == 0, p.stderr
    rows = [json.loads(line) for line in p.stdout.splitlines() if line.strip()]
    assert rows and all("not run" in r["note"] for r in rows)


@pytest.mark.parametrize("args,word", [
    (["--rope", "gptj"], "--rope"),
    (["--norm-order", "pre"], "--norm-order"),
    (["--kv-dtype", "fp16"], "--kv-dtype"),
    (["--tokens", "0"], "--tokens"),
    (["--tokens", "a,b"], "--tokens"),
    (["--head-dim", "96", "--tokens", "1"], "head_dim 96"),
    (["--impl", "bogus", "--tokens", "1"], "impl"),
    (["--q-heads", "6", "--kv-heads", "4", "--tokens", "1"], "multiple of kv_heads"),
    (["--rotary-dim", "40", "--tokens", "1", "--impl", "fused"], "rotary_dim"),
    (["--chain", "64y4", "--tokens", "1"], "64y4"),
    (["--chain", "4x64", "--q-len", "9"], "--q-len"),
    (["--variants", "baseline,fast", "--tokens", "1"], "--variants"),
])
def test_cli_bad_flags_exit_2(args, word):
    p = _cli(*args)
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert word in p.stderr


def test_trigger_must_be_a_bool():
    from hotpaths.kernels import attention_prologue as ap

    inp = ref.make_prologue_inputs(3, q_heads=2, kv_heads=1, head_dim=64, page_size=16, seed=1)
    a = [inp[k] for k in ("qkv", "q_norm_weight", "k_norm_weight", "cos_sin", "positions", "slot_mapping", "k_cache",
                          "v_cache")]
    with pytest.raises(TypeError, match="trigger"):
        ap.attention_prologue(*a, k_scale=inp["k_scale"], v_scale=inp["v_scale"], trigger="start")
    assert not hasattr(ap, "resolve_variant") and not hasattr(ap, "ITEMS")
    with pytest.raises(ValueError, match="variant"):
        ap.attention_prologue(*a, k_scale=inp["k_scale"], v_scale=inp["v_scale"], variant="i4")
    assert ap.DEFAULT_VARIANT in ap.VARIANTS


def test_fused_row_falls_back_to_emulation():
    from hotpaths.bench import attention_prologue as bap

    rows = bap.prologue_rows([3], impls=("fused",), iters=1)
    assert [r["impl"] for r in rows] == ["fused_emulation"]
    assert rows[0]["rel_l2_err"] < 0.1
    with pytest.raises(ValueError, match="impl"):
        bap.prologue_rows([3], impls=("fused_i4",))  # the multi-item launch variants are gone


def test_variant_rows_share_inputs_and_fall_back_to_emulation():
    """Each kernel variant is a row of its own (fused_<variant>) on the same inputs; without SM90 each runs the one
    emulation (the variants write the same bytes by design), untimed."""
    from hotpaths.bench import attention_prologue as bap

    names = tuple(bap.VARIANT_PREFIX + v for v in bap.fused_variants())
    assert bap.variant_of("fused") in bap.fused_variants() and bap.variant_of("fused_pair") == "pair"
    assert bap.variant_of("hpc_ops") is None and bap.variant_of("fused_nope") is None
    rows = bap.prologue_rows([3], impls=names, iters=1)
    if has_sm90():
        assert all(r["median_us"] > 0 for r in rows)
        return
    assert [r["impl"] for r in rows] == [n + "_emulation" for n in names]
    assert len({r["rel_l2_err"] for r in rows}) == 1 and rows[0]["rel_l2_err"] < 0.1


@cpu_only
def test_cli_variants_replace_fused():
    p = _cli("--tokens", "2", "--impl", "fused,hpc_ops", "--variants", "baseline,tokwarp2", "--json")
    assert p.returncode == 0, p.stderr
    impls = [json.loads(line)["impl"] for line in p.stdout.splitlines() if line.startswith("{")]
    assert impls == ["fused_baseline_emulation", "fused_tokwarp2_emulation", "hpc_ops"]


@pytest.mark.parametrize("tokens,q_heads,kv_heads,want", [
    (1, 8, 1, "baseline"), (256, 8, 1, "baseline"), (1024, 8, 1, "pair"), (16384, 8, 1, "pair"),
    (1, 64, 8, "baseline"), (256, 64, 8, "pair"), (4096, 64, 8, "tokwarp2"), (16384, 64, 8, "tokwarp2")])
def test_auto_variant_follows_the_measured_crossovers(tokens, q_heads, kv_heads, want):
    # each point is a measured case where `want` was the fastest (or level with the fastest) of the three kernels
    from hotpaths.kernels import attention_prologue as ap

    assert ap.choose_variant(tokens, q_heads, kv_heads) == want
    assert ap.DEFAULT_VARIANT == "auto" and set(ap.VARIANTS) == {"auto", "baseline", "pair", "tokwarp2"}


def test_auto_vs_fastest_reads_a_variants_table():
    import pandas as pd

    rows = [dict(case="8q1kv-decode-1", impl="fused_" + v, tokens=1, q_heads=8, kv_heads=1, median_us=u)
            for v, u in (("baseline", 5.0), ("pair", 5.5), ("tokwarp2", 7.0))]
    rows += [dict(case="8q1kv-prefill-4096", impl="fused_" + v, tokens=4096, q_heads=8, kv_heads=1, median_us=u)
             for v, u in (("baseline", 18.0), ("pair", 15.0), ("tokwarp2", 14.0))]
    rows += [dict(case="8q1kv-prefill-4096", impl="hpc_ops", tokens=4096, q_heads=8, kv_heads=1, median_us=1.0)]
    got = bap.auto_vs_fastest(pd.DataFrame(rows)).set_index("case")
    assert got.loc["8q1kv-decode-1", "auto_pick"] == "baseline" and got.loc["8q1kv-decode-1", "auto_over_fastest"] == 1
    # the peer row is not a variant; auto's pick (pair) is 15/14 of the fastest (tokwarp2)
    assert got.loc["8q1kv-prefill-4096", "fastest"] == "tokwarp2"
    assert got.loc["8q1kv-prefill-4096", "auto_over_fastest"] == pytest.approx(15 / 14)
