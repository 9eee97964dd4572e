"""CPU tests of the fused-MoE benchmark module and the ``hotpaths moe`` command (emulation fallback), plus the GPU
row checks (marker gpu: the kernel and its peers on an SM90 machine)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from hotpaths.bench import fused_moe as bm
from hotpaths.bench import fused_moe_peers as peers
from hotpaths.harness.tables import COLUMNS
from hotpaths.reference import fused_moe as fm

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--experts", "16", "--hidden", "256"]


def _cli(*args, shell_tail: str | None = None):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / ".hp"), env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-m", "hotpaths", "moe", *args]
    if shell_tail:
        line = " ".join(cmd) + " | " + shell_tail
        return subprocess.run(["bash", "-o", "pipefail", "-c", line], capture_output=True, text=True, env=env,
                              cwd=ROOT, timeout=300)
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback")
def test_rows_on_cpu_are_emulations_with_errors():
    rows = bm.moe_rows([4, 16], model="hy3", mode="tp8ep1", scales="block", impls=list(bm.IMPLS), experts=16,
                       hidden=256)
    assert len(rows) == 2 * len(bm.IMPLS)
    for r in rows:
        assert r["impl"].endswith("_emulation") and r["median_us"] is None and r["reason"]
        assert 0.99 < r["cosine"] <= 1.0 and r["rel_l2_err"] > 0
        assert r["experts_hit"] >= 1 and r["weight_bytes"] > 0 and r["batch"] in (4, 16)
    fused = [r for r in rows if r["impl"] == "fused_emulation"]
    assert all(r["vs_emulation_rel_l2"] == 0.0 and r["passed"] for r in fused)
    bf16 = [r for r in rows if r["impl"] == "torch_grouped_mm_bf16_emulation"]
    assert all(r["rel_l2_err"] < f["rel_l2_err"] for r, f in zip(bf16, fused))  # BF16 weights+x: less error
    assert rows[0]["published_h20_us"] == 42.0 and rows[0]["published_cutlass_h20_us"] == 74.5


def test_weight_bytes_follow_experts_hit():
    rows = bm.moe_rows([1, 64], impls=["fused"], experts=16, hidden=128, inter=1024)
    per_expert = 3 * 128 * 128 + 8
    for r in rows:
        assert r["weight_bytes"] == r["experts_hit"] * per_expert
    assert rows[0]["experts_hit"] == 8 and rows[1]["experts_hit"] == 16


def test_unknown_impl_and_table():
    with pytest.raises(ValueError, match="--impl"):
        bm.parse_impls("fused,cublas")
    with pytest.raises(ValueError, match="table"):
        bm.table_rows("fused_moe_tp4")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback")
def test_stage_rows_without_gpu_say_why():
    rows = bm.stage_rows([4])
    assert [r["stage"] for r in rows] == list(bm.STAGES) and all("SM90" in r["reason"] for r in rows)


def test_peers_refuse_on_cpu_with_a_reason():
    inp = fm.make_moe_inputs(4, experts=16, hidden=128, inter=1024)
    for name in peers.PEER_NAMES:
        fn, reason = peers.try_make(name, inp)
        if not torch.cuda.is_available():
            assert fn is None and "CUDA" in reason
    assert peers.try_make("nope", inp)[1].startswith("not available: unknown peer")
    with pytest.raises(KeyError):
        peers.emulate("nope", inp)


def test_flashinfer_cutlass_needs_the_jit_opt_in(monkeypatch):
    """Without $HOTPATHS_PEER_JIT=1 the CUTLASS MoE peer refuses before touching FlashInfer's compiler, with a reason
    naming the variable (the GPU and the bundle stood in for, so the gate itself is what refuses)."""
    inp = fm.make_moe_inputs(4, experts=16, hidden=128, inter=1024)
    monkeypatch.setattr(peers, "_need_cuda", lambda inputs: None)
    monkeypatch.setattr(peers, "import_flashinfer_072", lambda: None)
    monkeypatch.setattr(peers, "import_peer_attr", lambda *a, **k: pytest.fail("reached FlashInfer without opt-in"))
    monkeypatch.delenv(peers.PEER_JIT_ENV, raising=False)
    fn, reason = peers.try_make("flashinfer_cutlass", inp)
    assert fn is None and reason.startswith("skipped:") and peers.PEER_JIT_ENV in reason
    monkeypatch.setenv(peers.PEER_JIT_ENV, "1")  # opted in: the adapter goes on to import the peer
    with pytest.raises(pytest.fail.Exception, match="without opt-in"):
        peers.make_flashinfer_cutlass(inp)


def test_hpc_ops_dir_from_env(monkeypatch, tmp_path):
    monkeypatch.setenv("HOTPATHS_HPC_OPS_DIR", str(tmp_path))
    assert peers.hpc_ops_dir() == tmp_path
    with pytest.raises(peers.PeerUnavailable, match="no HPC-Ops package"):
        peers._import_hpc()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback")
def test_cli_json_rows():
    r = _cli("--batch", "4,5", "--mode", "tp1ep8", "--scales", "block", "--impl", "fused,hpc_ops", "--json", *SMALL)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(rows) == 4 and list(rows[0])[:len(COLUMNS)] == COLUMNS
    assert {x["impl"] for x in rows} == {"fused_emulation", "hpc_ops_emulation"}
    assert all(x["mode"] == "tp1ep8" and x["scales"] == "block" and x["cosine"] > 0.99 for x in rows)
    assert "--experts 16" in rows[0]["repro"]


def test_cli_check_and_text_output():
    r = _cli("--batch", "3", "--impl", "fused", "--check", *SMALL)
    assert r.returncode == 0, r.stderr
    assert "batch" in r.stdout.splitlines()[0] and "fused" in r.stdout


@pytest.mark.parametrize("args, name", [
    (["--bogus"], "--bogus"), (["--scales", "fp4"], "--scales"), (["--batch", "4,x"], "--batch"),
    (["--model", "llama"], "--model"), (["--impl", "cublas"], "--impl"), (["--hidden", "100"], "hidden"),
    (["--topk", "17"], "topk"),
])
def test_cli_bad_flags_exit_2_naming_them(args, name):
    r = _cli(*args, *SMALL[:2])
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert name in r.stderr and "Traceback" not in r.stderr


def test_cli_head_does_not_traceback():
    r = _cli("--batch", "4,8,12", "--impl", "fused,torch_grouped_mm_bf16", "--json", *SMALL, shell_tail="head -1")
    assert r.returncode == 0 and "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr, r.stderr
    assert len(r.stdout.splitlines()) == 1 and json.loads(r.stdout)["batch"] == 4


@pytest.mark.gpu
@pytest.mark.parametrize("scales", fm.SCALE_MODES)
@pytest.mark.parametrize("mode", fm.PAR_MODES)
def test_gpu_fused_rows_pass_their_tolerance(scales, mode):
    rows = bm.moe_rows([1, 4, 64, 512], model="hy3", mode=mode, scales=scales, impls=["fused"], iters=20)
    for r in rows:
        assert r["impl"] == "fused" and r["reason"] is None, r
        assert r["passed"] and r["vs_emulation_cosine"] >= 0.9999, r
        assert r["median_us"] > 0
        # a batch with no local expert hit (EP at batch 1) reads no weights: there is no read probe to compare with
        if r["weight_bytes"]:
            assert r["pct_of_read_probe"] > 0, r
        else:
            assert r["pct_of_read_probe"] is None and r["experts_hit"] == 0, r


def test_parse_ab_names_knob_and_values():
    assert bm.parse_ab("reduce_pdl=on,off") == ("reduce_pdl", ["on", "off"])
    assert bm.parse_ab(" gemm = auto, wgmma ,auto") == ("gemm", ["auto", "wgmma"])
    assert bm.parse_ab("block_m=16,128") == ("block_m", ["16", "128"])
    for bad, says in (("reduce_pdl", "KNOB=V1,V2"), ("bogus=1,2", "KNOB=V1,V2"), ("gemm=auto", "2 or more"),
                      ("gemm=auto,cublas", "2 or more distinct values"), ("block_m=16,48", "block_m"),
                      ("act_quant=fused,fused", "2 or more")):
        with pytest.raises(ValueError, match=says):
            bm.parse_ab(bad)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback")
def test_ab_rows_without_gpu_say_why():
    rows = bm.ab_rows([4, 16], "down_pdl", ["on", "off"], experts=16, hidden=256)
    assert [(r["batch"], r["variant"]) for r in rows] == [(4, "on"), (4, "off"), (16, "on"), (16, "off")]
    assert all(r["median_us"] is None and r["reason"] and r["knob"] == "down_pdl" for r in rows)
    assert all("--ab down_pdl=on,off" in r["repro"] for r in rows)
    with pytest.raises(ValueError, match="rounds"):
        bm.ab_rows([4], "gemm", ["auto", "wgmma"], rounds=0)


def test_cli_ab_rows_and_bad_knob():
    r = _cli("--batch", "4", "--ab", "reduce=narrow,wide", "--json", *SMALL)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [x["variant"] for x in rows] == ["narrow", "wide"] and {x["knob"] for x in rows} == {"reduce"}
    bad = _cli("--batch", "4", "--ab", "reduce=narrow", *SMALL)
    assert bad.returncode == 2 and "--ab reduce" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.gpu
@pytest.mark.parametrize("spec", ["gemm=auto,wgmma,wgmma_ws", "down_pdl=on,off", "reduce_pdl=off,on",
                                  "reduce=narrow,wide", "act_quant=fused,prepass", "route=small,one,multi"])
def test_gpu_ab_rows_are_bit_identical_and_timed(spec):
    """Every knob changes timing only: each variant's output equals the first's bit for bit, and each is timed."""
    knob, values = bm.parse_ab(spec)
    rows = bm.ab_rows([4, 64], knob, values, iters=10, rounds=2)
    assert len(rows) == 2 * len(values)
    for r in rows:
        assert r["reason"] is None and r["median_us"] > 0 and r["bit_identical"], r
        assert len(r["rounds_us"].split()) == 2 and r["p10_us"] <= r["median_us"] <= r["p90_us"]
    if knob == "gemm":
        assert {r["plan"].split("/")[0] for r in rows if r["variant"] == "wgmma"} == {"wgmma"}


@pytest.mark.gpu
def test_gpu_stage_rows():
    rows = bm.stage_rows([64], iters=20)
    t = {r["stage"]: r["median_us"] for r in rows}
    assert all(v and v > 0 for v in t.values())
    assert t["all"] <= t["gate_up"] + t["down"] + t["route"] + t["reduce"] + 5.0


@pytest.mark.gpu
@pytest.mark.parametrize("mode", fm.PAR_MODES)
def test_gpu_device_plan_equals_host_plan(mode):
    km, why = bm.kernel_module()
    assert km is not None, why
    for t, routing in ((0, "random"), (1, "random"), (37, "duplicates"), (64, "skip"), (200, "one_expert")):
        ids, d = fm.make_topk_ids(t, mode=mode, routing=routing, seed=t)
        ids = ids.cuda()
        p = km.plan(ids, num_experts=d["experts"], expert_offset=d["expert_offset"], max_tokens=256)
        torch.cuda.synchronize()
        host = fm.build_routing_plan(ids, num_experts=d["experts"], expert_offset=d["expert_offset"],
                                     max_tokens=256, block_m=p.block_m)
        dev = p.workspace.cpu().numpy()
        assert (dev == host.workspace).all(), f"{mode} t={t} {routing}\n" + fm.format_plan(host)


@pytest.mark.gpu
def test_gpu_peer_rows_time_or_say_why():
    rows = bm.moe_rows([4, 64], impls=list(bm.IMPLS), iters=10)
    for r in rows:
        assert (r["median_us"] and r["median_us"] > 0) or r["reason"], r
        if r["median_us"] and r["impl"] != "torch_grouped_mm_bf16":
            assert r["cosine"] > 0.99, r  # a peer fed the wrong layout or scales shows here
    fused = [r for r in rows if r["impl"] == "fused"]
    assert len(fused) == 2 and all(r["median_us"] for r in fused)


def test_gemm_path_choice_compares_auto_with_the_faster_path():
    import pandas as pd

    from hotpaths.bench import fused_moe as bm

    rows = [dict(scales="pertensor", model="hy3", mode="tp8ep1", batch=b, impl=i, median_us=u)
            for b, i, u in ((64, "fused_mma", 210.0), (64, "fused_wgmma_ws", 184.0), (64, "fused_mma_tma", 196.0),
                            (4096, "fused_wgmma", 787.0), (4096, "fused_wgmma_ws", 834.0),
                            (256, "fused_mma", 300.0))]  # one path only: left out
    got = bm.gemm_path_choice(pd.DataFrame(rows)).set_index("batch")
    assert list(got.index) == [64, 4096]
    assert got.loc[64, "auto_pick"] == "wgmma_ws" and got.loc[64, "auto_over_faster"] == 1.0  # 2.7 pairs per expert
    assert got.loc[64, "mma_tma_us"] == 196.0 and np.isnan(got.loc[64, "wgmma_us"])
    assert got.loc[4096, "auto_pick"] == "wgmma" and got.loc[4096, "faster"] == "wgmma"
    rows[1]["median_us"] = 230.0  # wgmma_ws now the slowest at 64: auto over the faster (mma_tma)
    assert bm.gemm_path_choice(pd.DataFrame(rows)).set_index("batch").loc[64, "auto_over_faster"] == \
        pytest.approx(230 / 196)
    rows[1]["impl"] = "fused_wgmma"  # auto's path not timed at 64
    assert np.isnan(bm.gemm_path_choice(pd.DataFrame(rows)).set_index("batch").loc[64, "auto_over_faster"])


# The op's kernels as ncu's CSV names them (the table's kernel column), and mangled, as its --kernel-name-base
# mangled regex sees them.
_NCU_NAMES = {
    "route_hist": "route_hist_kernel(const int *, int *, int, int, int)",
    "route_place": "route_place_kernel(const int *, const int *, int *, int, int, int, int, int)",
    "quant": "void quant_rows_kernel<0>(const __nv_bfloat16 *, unsigned char *, float *, const float *, const int *, "
             "int, int, int)",
    "wgmma": "void unnamed>::expert_wgmma_kernel<unnamed>::WgTraits<128, 1, 0>>(GemmArgs)",
    "reduce": "void reduce_wide_kernel<8, 2>(const int *, const float *, const __nv_bfloat16 *, const __nv_bfloat16 *, "
              "__nv_bfloat16 *, int, int, int, int, int)",
}
_MANGLED_REDUCE = "_ZN6hp_moe13reduce_kernelEPKiPKfPK13__nv_bfloat16S6_PS4_iiii"


def test_ncu_stages_and_kernel_regex():
    import re

    stages, seen = [], 0
    for k in ("route_hist", "route_place", "quant", "wgmma", "wgmma", "reduce"):
        stages.append(bm.ncu_stage(_NCU_NAMES[k], seen))
        seen += stages[-1] in ("gate_up", "down")
    assert stages == ["route", "route", "quant_x", "gate_up", "down", "reduce"]
    assert bm.ncu_stage("some_other_kernel()", 0) == "other"
    assert re.search(bm.NCU_KERNELS, _MANGLED_REDUCE)
    assert not re.search(bm.NCU_KERNELS, "_ZN2at6native13reduce_kernelILi512ELi1EEEvv")  # torch's reduce_kernel


def test_ncu_rows_one_row_per_launch_in_units(monkeypatch):
    import pandas as pd

    from hotpaths.harness import ncu

    seen = {}

    def fake_profile(snippet, *, kernel_regex, metrics, kernel_name_base, out_csv, launch_count, timeout_s):
        seen.update(regex=kernel_regex, base=kernel_name_base, out=out_csv, snippet=snippet)
        recs = []
        for launch, k in enumerate(("route_hist", "quant", "wgmma", "wgmma", "reduce")):
            for m, v in (("gpu__time_duration.sum", 1000.0 * (launch + 1)), ("dram__bytes_read.sum", 2.0**20 * 3),
                         ("dram__throughput.avg.pct_of_peak_sustained_elapsed", 50.0)):
                recs.append(dict(kernel=_NCU_NAMES[k], launch=launch, metric=m, value=v, unit="", note=""))
        return pd.DataFrame(recs, columns=ncu.COLUMNS)

    monkeypatch.setattr(ncu, "profile", fake_profile)
    rows = bm.ncu_rows([64])
    assert seen["regex"] == bm.NCU_KERNELS and seen["base"] == "mangled" and seen["out"] == "fused_moe_ncu_b64"
    assert "make_moe_inputs(64," in seen["snippet"]
    assert [r["stage"] for r in rows] == ["route", "quant_x", "gate_up", "down", "reduce"]
    assert [r["duration_us"] for r in rows] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert all(r["dram_read_mb"] == 3.0 and r["dram_pct"] == 50.0 and r["batch"] == 64 for r in rows)
    assert rows[2]["kernel"] == _NCU_NAMES["wgmma"] and rows[0]["dram_write_mb"] is None

    monkeypatch.setattr(ncu, "profile", lambda *a, **k: ncu.unavailable_table("no GPU here", bm.NCU_KERNELS))
    rows = bm.ncu_rows([64, 4096])
    assert [r["batch"] for r in rows] == [64, 4096] and all(r["note"] == "unavailable: no GPU here" for r in rows)
