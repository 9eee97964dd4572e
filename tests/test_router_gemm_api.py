"""CPU tests of the router GEMM API: plan/validation errors, the dispatch rule, the CLI's emulation fallback."""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from hotpaths.bench import router_gemm as rb
from hotpaths.kernels import router_gemm as rg
from hotpaths.reference import router_gemm as ref

N, K = 64, 128
no_gpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="the emulation fallback is the no-GPU path")
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed: the library is not built")


@pytest.fixture(scope="module")
def weights():
    _, w = ref.make_router_inputs(1, N, K, seed=1)
    return rg.plan(w)


def test_plan_holds_the_reference_split():
    _, w = ref.make_router_inputs(1, N, K, seed=2)
    p = rg.plan(w)
    hi, lo = ref.split_fp32_weight(w)
    assert torch.equal(p.w_high, hi) and torch.equal(p.w_low, lo) and p.w_mid is None and p.w_low2 is None
    assert (p.n, p.k) == (N, K) and p.w_high.is_contiguous() and p.w_high.dtype == torch.bfloat16
    p3 = rg.plan(w, three_part=True)
    assert torch.equal(torch.stack([p3.w_high, p3.w_mid, p3.w_low2]), torch.stack(ref.split_fp32_weight_3(w)))
    # a three-part plan still carries the two-part (round-to-nearest) low part for the BF16x2 kernel: the
    # three-part middle part is a truncation and would double the BF16x2 error (a bug caught on the H200)
    assert torch.equal(p3.w_low, lo) and not torch.equal(p3.w_mid, lo)


@pytest.mark.parametrize("shape", [(100, K), (N, 96), (N, 0)])
def test_plan_rejects_unsupported_shapes(shape):
    with pytest.raises(ValueError, match="multiple of 64"):
        rg.plan(torch.randn(*shape))


def test_plan_rejects_bad_weights():
    with pytest.raises(TypeError, match="float32"):
        rg.plan(torch.randn(N, K, dtype=torch.float64))
    with pytest.raises(ValueError, match="contiguous"):
        rg.plan(torch.randn(K, N).t())
    with pytest.raises(ValueError, match="2-D"):
        rg.plan(torch.randn(N * K))
    with pytest.raises(TypeError, match="Tensor"):
        rg.plan([[1.0]])
    w = torch.randn(N, K)
    w[0, 0] = float("inf")
    with pytest.raises(ValueError, match="non-finite"):
        rg.plan(w)


def test_router_gemm_validation(weights):
    x = torch.randn(3, K).to(torch.bfloat16)
    with pytest.raises(ValueError, match="impl"):
        rg.router_gemm(x, weights, impl="fp64_magic")
    with pytest.raises(TypeError, match="bfloat16"):
        rg.router_gemm(x.float(), weights)
    with pytest.raises(ValueError, match=r"K=128"):
        rg.router_gemm(torch.randn(3, K + 64).to(torch.bfloat16), weights)
    with pytest.raises(ValueError, match="contiguous"):
        rg.router_gemm(torch.randn(K, 3).to(torch.bfloat16).t(), weights)
    with pytest.raises(TypeError, match="RouterWeights"):
        rg.router_gemm(x, weights.w)
    with pytest.raises(ValueError, match="three_part"):
        rg.router_gemm(x, weights, impl="bf16x3_kernel")
    with pytest.raises(TypeError, match="float32"):
        rg.router_gemm(x, weights, impl="fp32_cublas", out=torch.empty(3, N, dtype=torch.float64))
    with pytest.raises(ValueError, match="out"):
        rg.router_gemm(x, weights, impl="fp32_cublas", out=torch.empty(3, N + 1))
    # the kernel needs a GPU: a clear error, not a silent fallback
    with pytest.raises(RuntimeError, match="SM90"):
        rg.router_gemm(x, weights, impl="bf16x2_kernel")


def test_m_zero_returns_empty(weights):
    out = rg.router_gemm(torch.empty(0, K, dtype=torch.bfloat16), weights, impl="bf16x2_kernel")
    assert out.shape == (0, N) and out.dtype == torch.float32


def test_cpu_baselines_compute_the_right_numbers(weights):
    x = torch.randn(5, K).to(torch.bfloat16)
    out = torch.full((5, N), float("nan"))
    rg.router_gemm(x, weights, impl="fp32_cublas", out=out)
    assert torch.allclose(out.double(), ref.router_gemm_ref(x, weights.w), rtol=0, atol=1e-5)
    b = rg.router_gemm(x, weights, impl="bf16_cublas")
    assert torch.allclose(b, ref.bf16_emulation(x, weights.w), rtol=0, atol=1e-5)


def test_choose_impl_rule():
    table = {"shapes": [{"n": 192, "k": 4096, "rows": [
        {"m": 1, "choice": "fp32_cublas"}, {"m": 4, "choice": "bf16x2_kernel"}, {"m": 4096, "choice": "fp32_cublas"}]}]}
    assert rg.choose_impl(1, 192, 4096, table) == "fp32_cublas"
    assert rg.choose_impl(2, 192, 4096, table) == "bf16x2_kernel"  # equidistant in log2: the larger M
    assert rg.choose_impl(3, 192, 4096, table) == "bf16x2_kernel"
    assert rg.choose_impl(100, 192, 4096, table) == "bf16x2_kernel"
    assert rg.choose_impl(3000, 192, 4096, table) == "fp32_cublas"
    assert rg.choose_impl(3, 256, 7168, table) == "bf16x2_kernel"  # shape not measured
    assert rg.choose_impl(3, 192, 4096, {}) == "bf16x2_kernel"


def test_dispatch_table_file_is_read(tmp_path, monkeypatch):
    monkeypatch.setenv("HOTPATHS_DISPATCH_DIR", str(tmp_path))
    assert rg.dispatch_path("cpu").name == "router_gemm_cpu.json"
    path = rg.dispatch_path()  # this device's tag
    assert path.parent == tmp_path
    path.write_text(json.dumps({"shapes": [{"n": 192, "k": 4096, "rows": [
        {"m": 48, "choice": "fp32_cublas", "kernel": {"variant": "decode", "splits": 8}},
        {"m": 4096, "choice": "bf16x2_kernel", "kernel": {"variant": "tiled64d", "splits": 4}}]}]}))
    rg.reload_dispatch_table()
    try:
        assert rg.choose_impl(8, 192, 4096) == "fp32_cublas"
        assert rg.tuned_config(8, 192, 4096) == ("decode", 8)
        assert rg.tuned_config(100, 192, 4096) == ("decode", 8)  # row blocks: decode runs up to M = 128
        assert rg.tuned_config(200, 192, 4096) is None  # nearest row is decode, which cannot run M > 128
        assert rg.tuned_config(700, 192, 4096) == ("tiled64d", 4)
        assert rg.tuned_config(700, 256, 4096) is None
    finally:
        rg.reload_dispatch_table()


@no_gpu_only
def test_benchmark_rows_fall_back_to_emulations():
    rows = rb.benchmark_rows([1, 3], N, K, ["dispatch", "bf16x2_kernel", "fp32_cublas", "tf32_cublas"], seed=4)
    # one row per distinct emulation, and dispatch kept as its own row (the emulation of what it would pick)
    assert [r["impl"] for r in rows] == ["bf16x2_emulation", "fp32_emulation", "tf32_emulation",
                                         "dispatch_emulation"] * 2
    assert all("dispatch picks" in r["note"] for r in rows if r["impl"] == "dispatch_emulation")
    for r in rows:
        assert r["median_us"] is None and r["op"] == "router_gemm" and r["case"] == f"hy3_m{r['m']}"
        assert (r["n"], r["k"]) == (N, K) and r["max_abs_err"] == r["max_abs_err_vs_fp64"]
    errs = {r["impl"]: r["max_abs_err_vs_fp64"] for r in rows if r["m"] == 3}
    # precision ordering: fp32 < bf16x2 < tf32 (the point of the two-part weight)
    assert errs["fp32_emulation"] < errs["bf16x2_emulation"] < errs["tf32_emulation"]


def test_kernel_candidates():
    c = rg.kernel_candidates(16, 192, 4096)
    assert ("decode_n1", 0) in c and ("decode_n2", 0) in c and ("tiled64d", 8) in c and ("tiled128", 1) in c
    assert all(not v.startswith("decode") for v, _ in rg.kernel_candidates(129, 192, 4096))
    assert ("tiled64d", 16) in rg.kernel_candidates(100, 192, 4096)  # 6 tiles x 16 ranks, 4 k-tiles each
    # big grids are not split further; every split keeps >= 4 k-steps
    assert ("tiled64", 8) not in rg.kernel_candidates(4096, 192, 4096)
    assert all((128 // rg.TILED_TILES[v][2]) // max(s, 1) >= 4 for v, s in rg.kernel_candidates(1, 64, 128)
               if not v.startswith("decode"))
    for m in (1, 100, 4096):
        assert all((128 // rg.TILED_TILES[v][2]) // max(s, 1) >= 4 for v, s in rg.kernel_candidates(m, 192, 128)
                   if not v.startswith("decode"))


def test_every_decode_variant_is_a_candidate_only_at_decode_sizes():
    assert set(rg.DECODE_VARIANTS) == {v for v in rg.VARIANTS if v.startswith("decode")} - {"decode"}
    assert sorted(rg.VARIANTS.values()) == list(range(len(rg.VARIANTS)))  # ids are the list order, no gaps
    for m in (1, 3, 17, 48, 64, 65, 100, 128):
        got = [v for v, s in rg.kernel_candidates(m, 192, 4096) if v.startswith("decode")]
        assert got == list(rg.DECODE_VARIANTS), m
    for m in (129, 2048):
        assert not [v for v, _ in rg.kernel_candidates(m, 192, 4096) if v.startswith("decode")]


@needs_nvcc
@pytest.mark.parametrize("n", [128, 192, 256, 384, 512, 768])
def test_candidates_at_every_target_shape(n):
    """The first-use tuner's list at the target grid: every decode variant at M <= 128 for every N (they are
    instantiated per m16 tiles and n8 tiles per warp, not per N; past 64 rows over row blocks), and from M = 65
    every tiled / wgmma variant whose tile divides the shape. The TMA family runs at BN = 192 (ws128n192*: N = 192,
    384, 768) and BN = 128 (ws128n128*: N = 128, 256, 384, 512, 768), so from M = 65 every target N has TMA
    candidates."""
    tiles = {**rg.TILED_TILES, **rg.WGMMA_TILES}
    for k in (2048, 3072, 4096, 6144, 7168):
        for m in (1, 16, 64, 100, 128):
            assert [v for v, _ in rg.kernel_candidates(m, n, k) if v.startswith("decode")] == \
                list(rg.DECODE_VARIANTS), (m, n, k)
        for m in (128, 1024):
            want = {v for v, (_, bn, bk) in tiles.items() if n % bn == 0 and k % bk == 0}
            want |= set(rg.DECODE_VARIANTS) if m <= rg.DECODE_MAX_M else set()
            assert {v for v, _ in rg.kernel_candidates(m, n, k)} == want, (m, n, k)
        ws = {v for v, _ in rg.kernel_candidates(1024, n, k) if v.startswith("ws")}
        assert {v for v in ws if v.startswith("ws128n192")} == ({"ws128n192g", "ws128n192p", "ws128n192r"}
                                                                 if n % 192 == 0 else set()), (n, k, ws)
        assert {v for v in ws if v.startswith("ws128n128")} == ({"ws128n128g", "ws128n128r"}
                                                                 if n % 128 == 0 else set()), (n, k, ws)


# The TMA kernel at BN = 128 (ws128n128g / r; the K-pair form ws128n128p was never picked on the H200 and removed):
# K splits offered per (M, N, K), worked out by hand from the rules of kernel_candidates (grid = ceil(M / 128) * N /
# 128 tiles x splits; the smallest split always, others while the grid stays <= 2 x 132 CTAs and every split keeps
# >= 4 k-tiles; the reduce-scatter only within one wave of 132).
BN128_SPLITS = [
    # (m, n, k): {variant: splits}
    ((1024, 256, 7168), {"ws128n128g": {1, 2, 4, 8}, "ws128n128r": {2, 4, 8}}),  # 16 tiles
    ((1024, 512, 6144), {"ws128n128g": {1, 2, 4, 8}, "ws128n128r": {2, 4}}),  # 32: 8 > 132
    ((4096, 512, 6144), {"ws128n128g": {1, 2}, "ws128n128r": set()}),  # 128 tiles: 256 > 132
    ((4096, 128, 2048), {"ws128n128g": {1, 2, 4, 8}, "ws128n128r": {2, 4}}),  # 32 tiles
    ((2048, 256, 4096), {"ws128n128g": {1, 2, 4, 8}, "ws128n128r": {2, 4}}),  # 32 tiles
    ((100, 128, 512), {"ws128n128g": {1, 2}, "ws128n128r": {2}}),  # 8 k-tiles: 4 per split
    ((65, 768, 4096), {"ws128n128g": {1, 2, 4, 8}, "ws128n128r": {2, 4, 8}}),  # 6 tiles
    ((64, 256, 4096), {"ws128n128g": set(), "ws128n128r": set()}),  # decode sizes
    ((1024, 192, 4096), {"ws128n128g": set(), "ws128n128r": set()}),  # 192 % 128
    ((1024, 320, 4096), {"ws128n128g": set(), "ws128n128r": set()}),  # 320 % 128
]


@needs_nvcc
@pytest.mark.parametrize("mnk,want", BN128_SPLITS, ids=[f"m{m}_n{n}_k{k}" for (m, n, k), _ in BN128_SPLITS])
def test_bn128_ws_candidates(mnk, want):
    """ws128n128g / r are first-use candidates exactly where 128 divides N and M >= WGMMA_MIN_M, with the splits
    above (hand-counted); their tile is 128 x 128 x 64 and they run the two-part weight only."""
    m, n, k = mnk
    got = rg.kernel_candidates(m, n, k)
    for v, splits in want.items():
        assert rg.WGMMA_TILES[v] == (128, 128, 64) and rg.VARIANT_PARTS[v] == 2
        assert {s for w, s in got if w == v} == splits, (mnk, v, got)
    assert {"ws128n128r"} <= set(rg.WGMMA_COOPERATIVE) and not {"ws128n128p"} & set(rg.VARIANTS)
    assert "ws128n128g" in rg.WGMMA_GLOBAL_SPLITK


def test_tiled_candidates_at_m2048():
    c = rg.kernel_candidates(2048, 192, 4096)
    for v, (bm, bn, _) in rg.TILED_TILES.items():
        tiles = (2048 // bm) * (192 // bn)  # splits while the grid stays <= 4 CTAs per SM (528)
        assert {s for w, s in c if w == v} == {s for s in (1, 2, 4, 8) if s == 1 or tiles * s <= 528}, v
    assert ("tiled64", 4) in c and ("tiled64", 8) not in c  # 96 tiles: 384 CTAs yes, 768 no


# ---- the variant list: router_variants.cuh is the one source; the library reports it, Python reads the report ---

VARIANTS_CUH = Path(rg.__file__).with_name("router_variants.cuh")
FAMILY_OF = {"kAutoFamily": "auto", "kDecodeFamily": "decode", "kTiledFamily": "tiled", "kWgFamily": "wgmma",
             "kWsFamily": "ws"}
SPLITK_OF = {"kSplitCluster": "cluster", "kSplitGlobal": "global", "kSplitPair": "pair", "kSplitScatter": "scatter"}


def parse_variant_list(text: str) -> list[tuple]:
    """The X-macro entries of router_variants.cuh: (name, family, (bm, bn, bk), parts, splitk), in id order."""
    body = text[text.index("#define HP_ROUTER_VARIANTS(X)"):]
    body = body[:body.index("\n\n")]
    rows = re.findall(r'X\((\w+), "(\w+)", (\w+), (\d+), (\d+), (\d+), (\d+), (\w+)[,)]', body)
    assert len(rows) == body.count("X("), "every entry matches the column grammar"
    return [(name, FAMILY_OF[fam], (int(bm), int(bn), int(bk)), int(parts), SPLITK_OF[sk])
            for _, name, fam, bm, bn, bk, parts, sk in rows]


@needs_nvcc
def test_python_view_is_the_variant_list():
    """The loader's table (read from the compiled library's hp_router_variant_* query) is the X-macro list, entry
    for entry; the derived views follow it."""
    listed = parse_variant_list(VARIANTS_CUH.read_text())
    got = [(v.name, v.family, v.tile, v.parts, v.splitk) for v in rg.variant_table().values()]
    assert got == listed
    assert [v.id for v in rg.variant_table().values()] == list(range(len(listed)))
    assert set(rg.TILED_TILES) == {n for n, f, *_ in listed if f == "tiled"}
    assert set(rg.WGMMA_TILES) == {n for n, f, *_ in listed if f in ("wgmma", "ws")}
    assert set(rg.WGMMA_REDUCE_SCATTER) == set(rg.WGMMA_COOPERATIVE) == {n for n, *_, s in listed if s == "scatter"}
    assert all(rg.VARIANT_PARTS[v] == 2 for v in rg.WGMMA_TILES)  # wgmma runs the two-part weight only


def test_variant_list_keeps_what_the_dispatch_table_picks():
    """Every variant the measured dispatch tables pick exists in the list, and every variant in the list is picked
    by a table, by the committed first-use sweep on the same device (its dispatch rows' config), or is a baseline
    (the heuristic's kernels: decode and its forced-n8 forms, tiled64, tiled128; the simplest wgmma kernel,
    wg128n96) - the rule that keeps the build small."""
    listed = {name for name, *_ in parse_variant_list(VARIANTS_CUH.read_text())}
    picked = set()
    for path in rg.DISPATCH_DIR.glob(f"{rg.OP}_*.json"):
        for shape in json.loads(path.read_text())["shapes"]:
            picked |= {row["kernel"]["variant"] for row in shape["rows"]}
    assert picked, "no dispatch table found"
    assert picked <= listed, picked - listed
    swept = set()
    for path in (rg.DISPATCH_DIR.parent / "results").glob("*/router_gemm_sweep.csv"):
        for row in csv.DictReader(path.open()):
            if row["impl"] == "dispatch" and row["config"].startswith("{"):
                swept.add(json.loads(row["config"])["variant"])
    assert swept, "no committed router_gemm_sweep table"
    assert swept <= listed, swept - listed
    baselines = {"auto", "decode", "decode_n1", "decode_n2", "tiled64", "tiled128", "wg128n96"}
    assert listed <= picked | swept | baselines, listed - picked - swept - baselines


@needs_nvcc
def test_decode_configs_host_side():
    """hp_router_gemm_config is host code: the C side knows every Python variant name (no GPU needed)."""
    want = {"decode_w8": (8, 1), "decode_c16w8": (16, 1)}
    for v, (cs, nt) in want.items():
        # past 64 rows: ceil(M / 64) row blocks of M / blocks rows each, in m16 tiles (65-96: two blocks of <= 48)
        for m, mt in ((1, 1), (16, 1), (17, 2), (33, 3), (48, 3), (49, 4), (64, 4), (65, 3), (96, 3), (97, 4),
                      (100, 4), (128, 4)):
            assert rg.kernel_config(m, 192, 4096, variant=v) == {"variant": v, "splits": cs, "mt": mt, "nt": nt}
        with pytest.raises(ValueError, match="decode needs M <= 128"):
            rg.kernel_config(129, 192, 4096, variant=v)
    for v, nt in (("decode_n1", 1), ("decode_n2", 2)):  # the baseline's kernels, reported as "decode"
        assert rg.kernel_config(48, 192, 4096, variant=v) == {"variant": "decode", "splits": 8, "mt": 3, "nt": nt}
    for v in rg.TILED_TILES:  # every tiled name resolves to itself, with a valid split
        cfg = rg.kernel_config(2048, 192, 4096, variant=v)
        assert cfg["variant"] == v and cfg["splits"] in (1, 2, 4, 8), (v, cfg)


@needs_nvcc
def test_tiled_sixteen_splits_host_side():
    """K split 16 ways (a non-portable cluster of 16) is a tiled-kernel configuration only, offered where the
    grid stays under ~2 CTAs per SM and every split keeps >= 4 k-steps (hand-counted below)."""
    assert rg.kernel_config(100, 128, 4096, variant="tiled64d", splits=16)["splits"] == 16
    for v in ("decode", "decode_w8", "wg128n96", "ws128n128g"):
        with pytest.raises(ValueError, match="tiled: also 16"):
            rg.kernel_config(100 if not v.startswith("decode") else 64, 384, 4096, variant=v, splits=16)
    with pytest.raises(ValueError):
        rg.kernel_config(100, 128, 4096, variant="tiled64d", splits=32)

    def sixteen(m, n, k):
        return {v for v, s in rg.kernel_candidates(m, n, k) if s == 16}
    # tiled64d (64 x 64, BK 64), tiled64 (BK 32), tiled128 (128 x 64, BK 32); base tiles x 16 <= 264
    assert sixteen(100, 128, 4096) == {"tiled64", "tiled64d", "tiled128"}  # 4 / 4 / 2 tiles; 4 / 8 / 8 k-steps
    assert sixteen(100, 128, 2048) == {"tiled64", "tiled128"}  # tiled64d: 32 k-tiles / 16 = 2
    assert sixteen(256, 256, 7168) == {"tiled64", "tiled64d", "tiled128"}  # 16 / 16 / 8 tiles
    assert sixteen(256, 384, 4096) == {"tiled128"}  # 24 tiles x 16 > 264; tiled128 12 tiles
    assert sixteen(1024, 128, 4096) == {"tiled128"}  # 16 tiles of 128 rows; tiled64 / 64d 32
    assert sixteen(2048, 128, 4096) == set()  # 32 tiles and up


def test_benchmark_rows_reject_unknown_impl():
    with pytest.raises(ValueError, match="impls"):
        rb.benchmark_rows([1], N, K, ["cutlass"])
    with pytest.raises(ValueError, match="multiple of 64"):
        rb.benchmark_rows([1], 100, K, ["dispatch"])


@no_gpu_only
def test_cli_emulation_fallback(capsys):
    from hotpaths.harness.cli import main

    assert main(["router", "--m", "1,3", "--n", str(N), "--k", str(K), "--impl", "bf16x2_kernel,bf16x3_kernel",
                 "--json"]) == 0
    lines = [json.loads(s) for s in capsys.readouterr().out.strip().splitlines()]
    assert [r["impl"] for r in lines] == ["bf16x2_emulation", "bf16x3_emulation"] * 2
    assert all(r["median_us"] is None and r["max_abs_err"] > 0 for r in lines)
    assert lines[1]["max_abs_err"] < lines[0]["max_abs_err"]  # three parts beat two


def test_cli_rejects_bad_shape(capsys):
    from hotpaths.harness.cli import main

    assert main(["router", "--m", "1", "--n", "100", "--k", str(K)]) == 2
    assert "multiple of 64" in capsys.readouterr().err


# ---- SM90 wgmma prefill variants: candidates and host-side checks (no GPU needed) ------------------------------


@pytest.mark.parametrize("n,k", [(192, 4096), (768, 6144), (384, 3072), (256, 7168), (64, 4096), (128, 4096),
                                 (320, 4096), (576, 1024)])
def test_wgmma_candidates_only_for_valid_shapes(n, k):
    """A wgmma variant is offered exactly when M >= WGMMA_MIN_M, its BN divides N and its BK divides K; its splits
    keep the grid within ~2 CTAs per SM (the smallest split always: 1, or 2 for the K-pair variants) and >= 4
    k-tiles per split; the cooperative ws128n192r only with a grid within one wave of the SM count."""
    def s_min(v):
        return 2 if v in rg.WGMMA_PAIR_SPLITK + rg.WGMMA_REDUCE_SCATTER else 1

    def tiles(v, m, n):  # output tiles of the grid
        bm, bn, _ = rg.WGMMA_TILES[v]
        return -(-m // bm) * (n // bn)

    for sms in (132, 78):
        for m in (1, 64, 65, 255, 256, 257, 1000, 2048, 4096):
            got = [(v, s) for v, s in rg.kernel_candidates(m, n, k, sm_count=sms) if v in rg.WGMMA_TILES]
            want_variants = {v for v, (bm, bn, bk) in rg.WGMMA_TILES.items()
                             if m >= rg.WGMMA_MIN_M and n % bn == 0 and k % bk == 0
                             and (v not in rg.WGMMA_COOPERATIVE or tiles(v, m, n) * s_min(v) <= sms)}
            assert {v for v, _ in got} == want_variants, (m, n, k, got)
            for v, s in got:
                bm, bn, bk = rg.WGMMA_TILES[v]
                grid = tiles(v, m, n) * s
                assert s in (1, 2, 4, 8) and (k // bk) // s >= 4, (v, s)
                assert s >= s_min(v) and (s == s_min(v) or grid <= 2 * 132), (m, v, s)
                assert v not in rg.WGMMA_COOPERATIVE or grid <= sms, (m, v, s, sms)
                assert (v, s_min(v)) in got


def test_wgmma_candidates_at_the_hy3_targets():
    # M = 4096, N = 192: 128 x 96 with 2 splits fills 128 of 132 SMs (one CTA each)
    c = rg.kernel_candidates(4096, 192, 4096)
    assert {("wg128n96", 2), ("ws128n192g", 4), ("ws128n192p", 2)} <= set(c)
    assert not [v for v, _ in c if v.startswith("ws128n128")]  # 192 % 128
    assert {v for v, _ in rg.kernel_candidates(4096, 256, 7168) if v in rg.WGMMA_TILES} == \
        {"ws128n128g", "ws128n128r"}  # 64 tiles: the reduce-scatter's 128 CTAs fit
    assert not [v for v, _ in rg.kernel_candidates(64, 192, 4096) if v in rg.WGMMA_TILES]  # decode sizes
    assert ("ws128n192p", 8) in rg.kernel_candidates(208, 768, 6144)  # the LongCat Chat prefill of 208 rows


def test_two_part_only_variants_refuse_bf16x3_before_touching_a_device():
    _, w = ref.make_router_inputs(1, 192, 256, seed=5)
    p3 = rg.plan(w, three_part=True)
    x = torch.randn(300, 256).to(torch.bfloat16)
    two_part = [v for v, parts in rg.VARIANT_PARTS.items() if parts == 2]
    assert set(rg.WGMMA_TILES) <= set(two_part)
    for v in two_part:
        with pytest.raises(ValueError, match="two-part"):
            rg.router_gemm(x, p3, impl="bf16x3_kernel", variant=v)


@needs_nvcc
def test_wgmma_configs_host_side():
    """hp_router_gemm_config / hp_router_gemm are host code up to the launch: the C side knows the wgmma names,
    picks a split that keeps one wave of CTAs, and refuses (cudaErrorInvalidValue = 1) N % BN != 0 and parts = 3
    before launching anything."""
    import ctypes

    for v, (bm, bn, _bk) in rg.WGMMA_TILES.items():
        for m in (1, 257, 4096):
            cfg = rg.kernel_config(m, 768, 4096, variant=v)
            assert cfg["variant"] == v and cfg["splits"] in (1, 2, 4, 8), (v, m, cfg)
            tiles = -(-m // bm) * (768 // bn)
            s_min = 2 if v in rg.WGMMA_PAIR_SPLITK + rg.WGMMA_REDUCE_SCATTER else 1  # two ranks at least
            assert cfg["splits"] == s_min or tiles * cfg["splits"] <= 132, (v, m, cfg)  # one wave
        assert rg.kernel_config(4096, 768, 4096, variant=v, splits=2)["splits"] == 2
        with pytest.raises(ValueError, match="multiple of their BN"):
            rg.kernel_config(2048, 64, 4096, variant=v)
    assert rg.kernel_config(4096, 192, 4096, variant="wg128n96")["splits"] == 2  # 64 tiles -> 128 CTAs
    lib = rg._lib()
    fake = ctypes.c_void_p(256)  # never dereferenced: every request is refused before any launch
    for parts, n, v in ((3, 192, "wg128n96"), (2, 256, "wg128n96"), (2, 192, "ws128n128g"), (3, 256, "ws128n128r"),
                        (3, 192, "ws128n192g"), (2, 256, "ws128n192g"), (3, 192, "decode_w8"),
                        (3, 192, "tiled64d")):
        code = lib.hp_router_gemm(fake, fake, fake, fake, fake, 300 if "decode" not in v else 3, n, 4096, parts,
                                  1 / 256, 1 / 256, rg.VARIANTS[v], 1 if "decode" not in v else 0, None)
        assert code == 1, (parts, n, v, code)


@needs_nvcc
def test_ws_configs_host_side():
    """The TMA variants' splits and workspace sizes, and the refusals (cudaErrorInvalidValue = 1) before launch."""
    import ctypes

    lib = rg._lib()
    fake = ctypes.c_void_p(256)
    # ws128n192g: split-K through a global workspace; its size is reported, and a launch without it is refused.
    g = rg.VARIANTS["ws128n192g"]
    assert lib.hp_router_gemm_workspace_bytes(4096, 192, 4096, g, 1) == 0
    assert lib.hp_router_gemm_workspace_bytes(4096, 192, 4096, rg.VARIANTS["wg128n96"], 4) == 0
    assert lib.hp_router_gemm_workspace_bytes(4096, 192, 4096, g, 4) == 256 + 32 * 4 * 128 * 192 * 4
    assert lib.hp_router_gemm_workspace_bytes(300, 384, 4096, g, 8) == 256 + 3 * 2 * 8 * 128 * 192 * 4
    assert lib.hp_router_gemm_workspace_bytes(300, 100, 4096, g, 8) == -1  # refused shape
    assert rg.kernel_config(4096, 192, 4096, variant="ws128n192g") == {"variant": "ws128n192g", "splits": 4,
                                                                         "mt": 0, "nt": 0}
    assert rg.kernel_config(2048, 192, 4096, variant="ws128n192g", splits=8)["splits"] == 8
    assert set(s for v, s in rg.kernel_candidates(2048, 192, 4096) if v == "ws128n192g") == {1, 2, 4, 8}
    # K pairs (ws128n192p): cluster (1, 1, 2); four counters per tile (ticket and stored count per 64-row half) and
    # S / 2 pair sums per tile in the workspace; 2 splits need none (the pair's DSMEM sum is the result); 1 refused.
    p = rg.VARIANTS["ws128n192p"]
    assert lib.hp_router_gemm_workspace_bytes(4096, 192, 4096, p, 2) == 0
    assert lib.hp_router_gemm_workspace_bytes(4096, 192, 4096, p, 4) == 512 + 32 * 2 * 128 * 192 * 4
    assert lib.hp_router_gemm_workspace_bytes(4096, 192, 4096, p, 1) == -1
    assert rg.kernel_config(4096, 192, 4096, variant="ws128n192p")["splits"] == 4
    assert rg.kernel_config(4096, 768, 6144, variant="ws128n192p")["splits"] == 2  # 4 x 32 tiles: 2 at least
    with pytest.raises(ValueError, match="splits 0, 2, 4, 8"):
        rg.kernel_config(2048, 192, 4096, variant="ws128n192p", splits=1)
    assert set(s for v, s in rg.kernel_candidates(2048, 192, 4096) if v == "ws128n192p") == {2, 4, 8}
    # Reduce-scatter (ws128n192r): no counters (a grid barrier), S partial tiles; 1 split refused.
    r = rg.VARIANTS["ws128n192r"]
    assert lib.hp_router_gemm_workspace_bytes(4096, 192, 4096, r, 4) == 32 * 4 * 128 * 192 * 4
    assert lib.hp_router_gemm_workspace_bytes(4096, 192, 4096, r, 1) == -1
    # BN = 128 (ws128n128g / r): the same layouts with 128 x 128 partial tiles; N must be a multiple of 128.
    g1, r1 = (rg.VARIANTS[v] for v in ("ws128n128g", "ws128n128r"))
    assert lib.hp_router_gemm_workspace_bytes(1024, 256, 7168, g1, 1) == 0
    assert lib.hp_router_gemm_workspace_bytes(1024, 256, 7168, g1, 8) == 256 + 16 * 8 * 128 * 128 * 4
    assert lib.hp_router_gemm_workspace_bytes(1100, 512, 6144, g1, 4) == 256 + 36 * 4 * 128 * 128 * 4  # 9 x 4 tiles
    assert lib.hp_router_gemm_workspace_bytes(1024, 256, 7168, r1, 8) == 16 * 8 * 128 * 128 * 4
    assert lib.hp_router_gemm_workspace_bytes(1024, 256, 7168, r1, 1) == -1
    assert lib.hp_router_gemm_workspace_bytes(1024, 192, 4096, g1, 4) == -1  # 192 % 128
    assert rg.kernel_config(1024, 256, 7168, variant="ws128n128r") == {"variant": "ws128n128r", "splits": 8,
                                                                         "mt": 0, "nt": 0}  # 16 tiles x 8
    assert rg.kernel_config(4096, 512, 6144, variant="ws128n128r")["splits"] == 2  # 128 tiles: 2 at least
    with pytest.raises(ValueError, match="multiple of their BN"):
        rg.kernel_config(1024, 192, 4096, variant="ws128n128g")
    for ws, nbytes in ((None, 0), (fake, 1024)):
        code = lib.hp_router_gemm_ex(fake, fake, fake, fake, fake, 4096, 192, 4096, 2, 1 / 256, 1 / 256, g, 4, ws,
                                     nbytes, None)
        assert code == 1, (ws, nbytes, code)


def test_tuned_config_bf16x3_skips_two_part_only_variants():
    """A row tuned to a two-part-only variant gives BF16x3 the fastest measured candidate that runs three parts;
    a variant this build does not have gives None (the heuristic)."""
    table = {"shapes": [{"n": 192, "k": 4096, "rows": [
        {"m": 4096, "choice": "bf16x2_kernel", "kernel": {"variant": "wg128n96", "splits": 2},
         "candidates_us": {"wg128n96/2": 40.1, "ws128n192g/2": 41.0, "tiled64d/2": 50.0, "tiled128/2": 55.8,
                           "tiled64/1": 60.0, "t128n96d/2": 30.0}},
        {"m": 8, "choice": "bf16x2_kernel", "kernel": {"variant": "wg128n96", "splits": 1},
         "candidates_us": {"wg128n96/1": 9.0}},
        {"m": 2, "choice": "bf16x2_kernel", "kernel": {"variant": "decode_w8", "splits": 0},
         "candidates_us": {"decode_w8/0": 6.9, "decode_n2/0": 7.1, "decode_n1/0": 7.3}},
        {"m": 32, "choice": "bf16x2_kernel", "kernel": {"variant": "t64n96d3", "splits": 2},
         "candidates_us": {"t64n96d3/2": 20.0}}]}]}
    assert rg.tuned_config(4096, 192, 4096, table) == ("wg128n96", 2)
    assert rg.tuned_config(4096, 192, 4096, table, parts=3) == ("tiled128", 2)  # t128n96d: not in this build
    assert rg.tuned_config(8, 192, 4096, table, parts=3) is None  # no three-part candidate measured
    assert rg.tuned_config(2, 192, 4096, table) == ("decode_w8", 0)
    assert rg.tuned_config(2, 192, 4096, table, parts=3) == ("decode_n2", 0)
    assert rg.tuned_config(32, 192, 4096, table) is None


@needs_nvcc
def test_tuned_reduce_scatter_stays_runnable_at_larger_m(monkeypatch):
    """A reduce-scatter row tuned at a smaller M than the call's (nearest M in log2 rounds both ways) whose grid
    would exceed one wave at the call's M (the launcher refuses it) runs as the same tile's global-split twin, same
    splits; within one wave it stays. The case the H200 found: N=768 K=6144, the M=208 row ws128n128r/8 at M=300
    (3 x 6 x 8 = 144 CTAs > 132)."""
    monkeypatch.setattr(rg, "_sm_count", lambda: 132)
    table = {"shapes": [{"n": 768, "k": 6144, "rows": [
        {"m": 208, "choice": "bf16x2_kernel", "kernel": {"variant": "ws128n128r", "splits": 8}},
        {"m": 1024, "choice": "bf16x2_kernel", "kernel": {"variant": "ws128n192r", "splits": 4}}]}]}
    assert rg.tuned_config(208, 768, 6144, table) == ("ws128n128r", 8)  # 2 x 6 x 8 = 96
    assert rg.tuned_config(256, 768, 6144, table) == ("ws128n128r", 8)  # 96
    assert rg.tuned_config(300, 768, 6144, table) == ("ws128n128g", 8)  # 144
    assert rg.tuned_config(1024, 768, 6144, table) == ("ws128n192r", 4)  # 8 x 4 x 4 = 128
    assert rg.tuned_config(1100, 768, 6144, table) == ("ws128n192g", 4)  # 9 x 4 x 4 = 144


def test_accuracy_gate_of_the_tuner():
    """measure_crossover drops a configuration whose max abs error vs FP64 exceeds ERR_BOUND (1.5) x the
    emulation's (at the bound it passes, just above it fails with the ratio in the reason), or whose top-k sets
    differ from FP64's on more tokens than the emulation's."""
    ref64 = torch.zeros(3, 4, dtype=torch.float64)
    got = torch.zeros(3, 4)
    assert rg.ERR_BOUND == 1.5
    got[1, 2] = 1.5e-5
    assert rb.accuracy_failure(got, ref64, 1e-5) is None
    got[1, 2] = 1.6e-5
    why = rb.accuracy_failure(got, ref64, 1e-5)
    assert why and "1.60x" in why and "bound 1.5x" in why
    assert rb.accuracy_failure(got, ref64, 1e-5, bound=2.0) is None
    # top-k flips: one token whose top-2 set changes (columns 0, 1 -> 0, 3) against an emulation with none
    ref64 = torch.tensor([[4.0, 3.0, 1.0, 2.0], [4.0, 3.0, 2.0, 1.0]], dtype=torch.float64)
    got = ref64.float().clone()
    got[0, 3] = 3.5
    assert rb.accuracy_failure(got, ref64, 1.0, topk=2) is None  # flips not checked without emu_flips
    why = rb.accuracy_failure(got, ref64, 1.0, emu_flips=0, topk=2)
    assert why and "flips vs FP64 1 > the emulation's 0" in why
    assert rb.accuracy_failure(got, ref64, 1.0, emu_flips=1, topk=2) is None


def test_bf16x2_cublas_is_the_two_part_arithmetic():
    """impl="bf16x2_cublas" (a first-use dispatch candidate): one GEMM against [w_high; w_low], then
    acc_hi + acc_lo / 256: the BF16x2 emulation's numbers (same FP32 products, the 1/256 exact), also for weights
    assembled from separate parts; plan() keeps the parts as the two halves of one buffer, so the GEMM's [2N, K]
    operand is a view of it (no extra memory, no copy per call)."""
    x, w = ref.make_router_inputs(5, N, K, seed=11)
    p = rg.plan(w)
    cat = rg._stacked_parts(p)
    assert cat.shape == (2 * N, K) and p.w_high.data_ptr() == cat.data_ptr()
    assert p.w_high.is_contiguous() and p.w_low.is_contiguous()
    assert torch.equal(torch.cat([p.w_high, p.w_low]), cat)
    hi, lo = ref.split_fp32_weight(w)
    assert torch.equal(p.w_high, hi) and torch.equal(p.w_low, lo)
    emu = ref.bf16x2_from_parts(x, p.w_high, p.w_low)
    out = torch.full((5, N), float("nan"))
    got = rg.router_gemm(x, p, impl="bf16x2_cublas", out=out)
    assert got is out and torch.isfinite(out).all()
    assert float((got - emu).abs().max()) <= 1e-6 * float(emu.abs().max())
    loose = rg.RouterWeights(w=w, w_high=hi, w_low=lo, w_mid=None, w_low2=None, w_bf16=w.bfloat16(), n=N, k=K,
                             three_part=False)
    assert rg._stacked_parts(loose).data_ptr() not in (hi.data_ptr(), lo.data_ptr())  # separate parts: a copy
    assert torch.allclose(rg.router_gemm(x, loose, impl="bf16x2_cublas"), got, rtol=0, atol=1e-6)
    # not the one-part BF16 GEMM: its error vs FP64 is the two-part class, far below BF16's
    r64 = ref.router_gemm_ref(x, w)
    bf16 = rg.router_gemm(x, p, impl="bf16_cublas")
    assert float((got.double() - r64).abs().max()) * 20 < float((bf16.double() - r64).abs().max())
