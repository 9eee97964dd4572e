"""CPU tests of the decode benchmark driver and its peers (GPU timing is exercised by notebook 02 on the H200)."""

import math

import pytest
import torch

from hotpaths.bench import split_kv_decode as D
from hotpaths.bench import split_kv_decode_peers as P
from hotpaths.harness.check import check
from hotpaths.harness.tables import COLUMNS
from hotpaths.reference.split_kv_decode import make_decode_inputs, split_kv_decode_ref

CPU_ONLY = not torch.cuda.is_available()


@pytest.fixture(scope="module")
def cpu_rows():
    return D.decode_rows(["3x100+1x700", "2x64+1x0"], kv_dtypes=("fp8", "bf16"), log=None)


def test_rows_have_every_contract_column(cpu_rows):
    for r in cpu_rows:
        missing = [c for c in COLUMNS + D.EXTRA_COLUMNS if c not in r]
        assert not missing, f"row {r['impl']} lacks {missing}"
        assert r["op"] == "split_kv_decode" and r["dtype"] in ("fp8_kv", "bf16_kv")
        assert r["repro"].startswith("hotpaths decode --cases ") and f"--kv-dtype {r['dtype'][:-3]}" in r["repro"]


@pytest.mark.skipif(not CPU_ONLY, reason="checks the CPU (no-GPU) behaviour")
def test_cpu_emulation_rows_correct_and_untimed(cpu_rows):
    emu = [r for r in cpu_rows if r["impl"].endswith("_emulation")]
    # 2 cases x 2 dtypes x 4 schedules
    assert len(emu) == 16
    assert {r["impl"] for r in emu} == {m + "_emulation" for m in D.OUR_IMPLS}
    for r in emu:
        assert r["median_us"] is None and r["gbps"] is None
        for k in ("rel_l2_err", "max_abs_err", "cosine"):
            assert math.isfinite(r[k]), (r["impl"], k, r[k])
        assert r["check_passed"] is True
        assert r["rel_l2_err"] <= 1e-2 and r["cosine"] >= 0.9999
        assert r["bytes"] > r["kv_bytes"] > 0


@pytest.mark.skipif(not CPU_ONLY, reason="checks the CPU (no-GPU) behaviour")
def test_peers_report_unavailability_on_cpu(cpu_rows):
    for name in P.PEER_NAMES:
        reason = P.available(name)
        assert isinstance(reason, str) and reason.startswith("not available:"), (name, reason)
        fn, why = P.try_make(name, make_decode_inputs([64], seed=0))
        assert fn is None and "CUDA" in why
    peer_rows = [r for r in cpu_rows if r["impl"] in P.PEER_NAMES]
    assert len(peer_rows) == len(P.PEER_NAMES) * 4
    assert all(r["median_us"] is None and r["note"].startswith("not available") for r in peer_rows)
    # no HPC-Ops time: vs_hpc_ops empty everywhere, every row carries its q_len
    assert all(r["vs_hpc_ops"] is None and r["hpc_ops_us"] is None and r["q_len"] == 1 for r in cpu_rows)


def test_unknown_peer_is_a_reason_not_an_exception():
    assert "unknown peer" in P.available("no_such_peer")


def test_bundles_missing_give_clean_reasons(tmp_path, monkeypatch):
    from hotpaths.bench import _peers_common as C

    monkeypatch.setenv("HOTPATHS_FLASHINFER_072_DIR", str(tmp_path / "absent_fi"))
    monkeypatch.setenv("HOTPATHS_HPC_OPS_DIR", str(tmp_path / "absent_hpc"))
    with pytest.raises(C.PeerUnavailable, match=r"no FlashInfer 0\.7\.2 at .*absent_fi.*HOTPATHS_FLASHINFER_072_DIR"):
        C.import_flashinfer_072()
    with pytest.raises(C.PeerUnavailable, match=r"no HPC-Ops package at .*absent_hpc.*HOTPATHS_HPC_OPS_DIR"):
        C.import_hpc_ops()
    # a package that is there but cannot be imported: the import error is the reason, nothing else escapes
    bad = tmp_path / "bad_hpc" / "hpc"
    bad.mkdir(parents=True)
    (bad / "__init__.py").write_text("raise ImportError('built for torch 2.11 + sm_90a')\n")
    monkeypatch.setenv("HOTPATHS_HPC_OPS_DIR", str(tmp_path / "bad_hpc"))
    with pytest.raises(C.PeerUnavailable, match="import hpc failed: ImportError: built for torch 2.11"):
        C.import_hpc_ops()


def test_clean_cache_copy_zeroes_exactly_the_unused_slots():
    for kv in ("fp8", "bf16"):
        inp = make_decode_inputs([1, 63, 200, 0, 130], q_heads=8, kv_heads=2, head_dim=64, page_size=16,
                                 kv_dtype=kv, seed=5)
        kc, vc = P.clean_cache_copy(inp)
        for clean, orig in ((kc, inp["k_cache"]), (vc, inp["v_cache"])):
            assert clean.dtype == orig.dtype and clean.shape == orig.shape
            assert not torch.isnan(clean.float()).any()  # every poisoned slot is gone
            # the tokens themselves are bit-identical, so the reference on the clean copy equals the original one
        ref0 = split_kv_decode_ref(**inp)
        ref1 = split_kv_decode_ref(**dict(inp, k_cache=kc, v_cache=vc))
        assert torch.equal(ref0, ref1)
        assert not torch.isnan(inp["k_cache"].float()).all()  # the original is untouched (still poisoned)
        assert torch.isnan(inp["k_cache"].float()).any()
        ps, bt = inp["k_cache"].shape[1], inp["block_table"]
        r, L = 1, 63  # the unused tail of request 1's last page is zero, its tokens are kept
        page = int(bt[r, (L - 1) // ps])
        assert (kc[page, L % ps:].float() == 0).all()
        assert torch.equal(kc[page, : L % ps].view(torch.uint8 if kv == "fp8" else torch.int16),
                           inp["k_cache"][page, : L % ps].view(torch.uint8 if kv == "fp8" else torch.int16))


def test_hpc_ops_peers_reject_unsupported_configs_before_importing(monkeypatch, tmp_path):
    # the GQA and page checks come before the bundle import, so their reasons are the ones reported
    monkeypatch.setattr(P, "_need_cuda", lambda inputs, allow_cpu: None)
    monkeypatch.setenv("HOTPATHS_HPC_OPS_DIR", str(tmp_path / "absent"))
    inp = make_decode_inputs([64], q_heads=2, kv_heads=1, head_dim=64, page_size=16, kv_dtype="fp8")
    with pytest.raises(P.PeerUnavailable, match="4 or 8 query heads per KV head"):
        P.make_hpc_ops_dynamic(inp)
    inp = make_decode_inputs([64], q_heads=8, kv_heads=1, head_dim=64, page_size=16, kv_dtype="fp8")
    with pytest.raises(P.PeerUnavailable, match="page size 64"):
        P.make_hpc_ops_static(inp)
    inp = make_decode_inputs([64], q_heads=8, kv_heads=1, head_dim=64, page_size=64, kv_dtype="fp8")
    with pytest.raises(P.PeerUnavailable, match="no HPC-Ops package"):
        P.make_hpc_ops_static(inp)
    inp = make_decode_inputs([64], q_heads=8, kv_heads=1, head_dim=64, page_size=64, q_len=2, kv_dtype="bf16")
    with pytest.raises(P.PeerUnavailable, match="q_len"):
        P.make_flashinfer_tc(inp)


def test_published_lookup():
    # data/reported/decode_fp8_kv_distribution_h20.csv: 1x128K+31x4K = 0.063 / 0.186 / 0.220 / 0.097 ms
    assert D.published_h20_us("1x128K+31x4K", "dynamic", "fp8") == pytest.approx(63.0)
    assert D.published_h20_us("1x128K+31x4K", "static_count", "fp8") == pytest.approx(186.0)
    assert D.published_h20_us("1x128K+31x4K", "static_chunk_emulation", "fp8") == pytest.approx(186.0)
    assert D.published_h20_us("1x128K+31x4K", "flashinfer_tc", "fp8") == pytest.approx(220.0)
    assert D.published_h20_us("1x128K+31x4K", "flashinfer_xqa", "fp8") == pytest.approx(220.0)
    assert D.published_h20_us("1x128K+31x4K", "flashattention", "fp8") == pytest.approx(97.0)
    assert D.published_h20_us("64x0.5K", "dynamic", "fp8") == pytest.approx(13.0)
    assert D.published_h20_us("1x128K+31x4K", "dynamic", "bf16") is None      # published table is FP8 KV only
    assert D.published_h20_us("1x16K+15x64", "dynamic", "fp8") is None        # not a published case
    assert D.published_h20_us("1x128K+31x4K", "torch_sdpa_gathered", "fp8") is None
    assert D.published_dynamic_vs_static("1x128K+31x4K") == pytest.approx(2.95)
    assert not hasattr(D, "HPC_OPS_H200_US")  # HPC-Ops is measured in the same run, never typed in


def test_ratio_columns_filled_from_medians():
    mk = lambda impl, us: dict(case="c", dtype="fp8_kv", impl=impl, median_us=us, dynamic_vs_static=None)  # noqa
    rows = [mk("dynamic", 10.0), mk("static_count", 30.0), mk("static_chunk", 20.0), mk("flashinfer_xqa", 40.0)]
    D._fill_ratios(rows)
    assert rows[0]["dynamic_vs_static"] == pytest.approx(2.0)  # vs the faster static flavour
    assert rows[1]["dynamic_vs_static"] == pytest.approx(3.0)
    assert rows[3]["dynamic_vs_static"] is None
    assert rows[0].get("vs_hpc_ops") is None and "HPC-Ops not requested" in rows[0]["note"]


def test_vs_hpc_ops_is_the_same_run_ratio_per_q_len():
    def mk(impl, us, q_len=1, note=""):
        return dict(case="c", dtype="fp8_kv", impl=impl, median_us=us, q_len=q_len, note=note,
                    dynamic_vs_static=None, hpc_ops_us=None, vs_hpc_ops=None)
    rows = [mk("dynamic", 10.0), mk("hpc_ops_dynamic", 12.0), mk("hpc_ops_static", 11.0), mk("flashinfer_xqa", 22.0),
            mk("dynamic", 20.0, q_len=2), mk("hpc_ops_dynamic", None, q_len=2, note="not available: boom"),
            mk("assign_only", 5.0)]
    D._fill_ratios(rows)
    assert rows[0]["hpc_ops_us"] == 11.0 and rows[0]["vs_hpc_ops"] == pytest.approx(1.1)  # HPC-Ops' faster impl
    assert rows[3]["vs_hpc_ops"] == pytest.approx(0.5)
    assert rows[1]["vs_hpc_ops"] is None and rows[2]["vs_hpc_ops"] is None  # not against itself
    # q_len 2: HPC-Ops did not run there: empty, with its reason (q_len 1's time is never borrowed)
    assert rows[4]["vs_hpc_ops"] is None and "not available: boom" in rows[4]["note"]
    assert rows[6]["vs_hpc_ops"] is None  # the assign kernel alone is not a decode step


def test_ncu_regex_names_the_timed_instantiation():
    import re

    ns = "_ZN45_GLOBAL__N__03c7c135_12_attention_cu_3164857a16"  # the anonymous namespace, as nvcc mangles it
    names = {v: f"{ns}attention_kernelINS_6TraitsILb{a}ELb{b}ELi{c}ELi{d}ELi{e}EEEEEvNS_6ParamsE"
             for v, (a, b, c, d, e) in {"v3s2c4": (1, 1, 2, 4, 1), "v2": (1, 0, 4, 2, 1), "v3": (1, 1, 4, 2, 1),
                                        "v3s5": (1, 1, 5, 2, 1)}.items()}
    for variant, name in names.items():
        rx = D.attention_kernel_regex(variant)
        assert re.search(rx, name), (variant, rx)
        assert [v for v, n in names.items() if re.search(rx, n)] == [variant]  # only its own instantiation
        assert set(rx) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.*")  # plain dialect
    # the kernel and the host stub of the same instantiation both contain the pattern: ncu sees only the kernel
    assert re.search(D.attention_kernel_regex("v3s2c4"), "_ZGVZL130__device_stub__" + names["v3s2c4"])
    assert D.attention_traits("v3s2c4", fp8=False) == (False, False, 2, 2, 1)  # BF16 runs the row layout
    assert D.attention_traits("v3s2c4", rows=16) == (True, True, 4, 2, 2)
    assert D.attention_traits("v3m", rows=32) == (True, True, 2, 2, 4)
    assert D.attention_traits("v3m", rows=16) == (True, True, 4, 2, 2)
    assert D.attention_traits("v3m", rows=8) == (True, True, 4, 2, 1)
    with pytest.raises(ValueError, match="variant"):
        D.attention_traits("v3mv")  # measured and removed (v3w is faster on every case it ran)
    nt2 = f"{ns}attention_kernelINS_6TraitsILb1ELb1ELi4ELi2ELi2EEEEEvNS_6ParamsE"
    assert re.search(D.attention_kernel_regex("v3s2c4", rows=16), nt2)
    assert not re.search(D.attention_kernel_regex("v3s2c4", rows=16), names["v3s2c4"])
    with pytest.raises(ValueError, match="variant"):
        D.attention_traits("v2f")  # measured and removed
    # the BF16 transposed configurations: their own kernel at <= 8 rows, the row layout above; FP8 runs v3 / v3s3c3
    assert D.attention_traits("v3b", fp8=False) == (False, True, 2, 2, 1)
    assert D.attention_traits("v3bs3", fp8=False) == (False, True, 3, 2, 1)
    assert D.attention_traits("v3bc3", fp8=False) == (False, True, 2, 3, 1)
    assert D.attention_traits("v3bs3", fp8=False, rows=16) == (False, False, 2, 2, 1)
    assert D.attention_traits("v3b") == D.attention_traits("v3bs3") == D.attention_traits("v3")
    # v3w / v3wc3: the warpgroup-MMA kernel (TraitsWg<STAGES, CPS, FP8>, groups of 64 rows) for every FP8 row count;
    # BF16: v3w's own instantiation (2 stages, 2 per SM), the row layout under v3wc3
    wgname = lambda st, cps, f8: f"{ns}attention_kernelINS_8TraitsWgILi{st}ELi{cps}ELb{f8}EEEEvNS_6ParamsE"  # noqa: E731
    for v, st, cps in (("v3w", 3, 2), ("v3wc3", 2, 3)):
        for rows in (8, 16, 32, 64):
            assert D.attention_traits(v, rows=rows) == (True, True, st, cps, 8)
        wg = wgname(st, cps, 1)
        assert re.search(D.attention_kernel_regex(v, rows=32), wg)
        assert not any(re.search(D.attention_kernel_regex(v, rows=32), n) for n in names.values())
        assert not re.search(D.attention_kernel_regex("v3m", rows=32), wg)
        assert not re.search(D.attention_kernel_regex(v, rows=32), wgname(2, 2, 0))
    assert not re.search(D.attention_kernel_regex("v3w"), wgname(2, 3, 1))
    for rows in (8, 16, 32):
        assert D.attention_traits("v3w", fp8=False, rows=rows) == (False, True, 2, 2, 8)
    assert D.attention_traits("v3wc3", fp8=False) == (False, False, 2, 2, 1)
    assert re.search(D.attention_kernel_regex("v3w", fp8=False, rows=32), wgname(2, 2, 0))
    assert not re.search(D.attention_kernel_regex("v3w", fp8=False, rows=32), wgname(3, 2, 1))
    assert D.attention_traits("v3bc3") == D.attention_traits("v3s3c3")
    rx = D.attention_kernel_regex("v3bs3", fp8=False)
    mangled = lambda a, b, c, d: f"{ns}attention_kernelINS_6TraitsILb{a}ELb{b}ELi{c}ELi{d}ELi1EEEEEvNS_6ParamsE"  # noqa: E731
    assert re.search(rx, mangled(0, 1, 3, 2))
    assert not re.search(rx, mangled(0, 1, 2, 2)) and not re.search(rx, mangled(1, 1, 3, 2))


def test_impl_specs_carry_plan_settings():
    """``mode:token:...`` impls (the A/B of kernel configurations in one run) parse to plan() settings; a bad token,
    a repeated setting or a mode that is not ours is refused naming the spec, by decode_rows and by the CLI parser."""
    from hotpaths.kernels import split_kv_decode as K

    assert D.split_impl("dynamic") == ("dynamic", {})
    assert D.split_impl("dynamic:v3b:fuseall:cw32:mt4") == (
        "dynamic", dict(variant="v3b", fuse_max=K.FUSE_ALL, combine_warps=32, min_tiles=4))
    assert D.split_impl("static_count:v2:fuse8") == ("static_count", dict(variant="v2", fuse_max=8))
    assert D.split_impl("dynamic:auto:cw8") == ("dynamic", dict(variant="auto", combine_warps=8))
    assert D.split_impl("dynamic:v3bs3:fuseauto:cwauto") == (
        "dynamic", dict(variant="v3bs3", fuse_max="auto", combine_warps="auto"))
    for bad, why in (("dynamic:v9", "unknown token"), ("dynamic:cw16", "unknown token"), ("dynamic:mt0", "unknown"),
                     ("dynamic:v2:v3", "twice"), ("dynamic:fuse2:fuseall", "twice"), ("flashinfer_xqa:v3", "not one")):
        with pytest.raises(ValueError, match=why):
            D.split_impl(bad)
    impls, assign = D.parse_impls("dynamic:v3b:fuseall,dynamic,flashinfer_xqa,dynamic:v3b:fuseall")
    assert impls == ["dynamic:v3b:fuseall", "dynamic", "flashinfer_xqa"] and not assign
    with pytest.raises(ValueError, match="unknown token"):
        D.parse_impls("dynamic:v3b:fusall")
    with pytest.raises(ValueError, match="unknown token"):
        D.decode_rows(["1x64"], impls=("dynamic:nope",), log=None)
    assert D._base_impl("dynamic:v3b:mt4_emulation") == "dynamic"
    assert "--impl dynamic:v3b:mt4 " in D.repro("1x64", "dynamic:v3b:mt4_emulation", "bf16")


def test_cpu_spec_rows_use_the_spec_min_tiles():
    """Without SM90 a spec row is the emulation over the task map its settings give (mt<N> changes the chunking),
    and stays correct against the exact reference."""
    rows = D.decode_rows(["2x700"], kv_dtypes=("bf16",), impls=("dynamic:v3b:fuseall:mt11", "dynamic"), log=None)
    if not CPU_ONLY:
        pytest.skip("GPU present: the rows are timed kernels, covered by the GPU tests")
    assert [r["impl"] for r in rows] == ["dynamic:v3b:fuseall:mt11_emulation", "dynamic_emulation"]
    assert all(r["check_passed"] for r in rows)
    lens = [700, 700]
    # a budget of exactly one pair's 11 tiles keeps every pair whole; 16 does not (pair 1 straddles bins 0 and 1)
    whole = D.emulation_task_map(lens, "dynamic", kv_heads=1, min_tiles=11)
    assert max(whole.num_chunks) == 1
    assert max(D.emulation_task_map(lens, "dynamic", kv_heads=1, min_tiles=16).num_chunks) == 2
    assert max(D.emulation_task_map(lens, "dynamic", kv_heads=1, min_tiles=2).num_chunks) > 1


def test_longest_chunk_estimate_bounds_the_host_map():
    """The chunk estimate behind plan(fuse_max="auto" / combine_warps="auto") and auto's variant choice is an upper
    bound of the host task map's longest pair, within one chunk, on the published cases and edge batches."""
    from hotpaths.harness.shapes import expand_lengths
    from hotpaths.kernels import split_kv_decode as K

    for case in list(D.ISSUE_CASES) + ["3x1+1x0", "7x64", "1x130000+5x700"]:
        lens = expand_lengths(case)
        tiles = [-(-L // 64) for L in lens]
        for C, F in ((264, 2), (528, 2), (264, 8), (16, 1)):
            est = K._longest_chunks(tiles, 1, C, F)
            got = int(max(D.emulation_task_map(lens, "dynamic", kv_heads=1, num_ctas=C, min_tiles=F).num_chunks))
            assert got <= est <= got + 1, (case, C, F, got, est)
    assert K._longest_chunks([0, 0], 1, 8, 2) == 0


def test_ncu_regex_matches_the_built_library():
    # every instantiation the regex can name exists in the compiled library under that mangled pattern
    import re

    from hotpaths.kernels import _build

    lib = _build.library_path("split_kv_decode")
    if not lib.exists():
        pytest.skip(f"kernels not built here ({lib}); the sm_90a compile test builds them")
    syms = set(re.findall(rb"_ZN[A-Za-z0-9_]*attention_kernelI[A-Za-z0-9_]*", lib.read_bytes()))
    for variant in ("v2", "v3", "v3s2c4", "v3s3c3", "v3s5", "v3m", "v3w", "v3wc3"):
        for fp8, rows in ((True, 8), (True, 16), (True, 32), (False, 8)):
            rx = D.attention_kernel_regex(variant, fp8=fp8, rows=rows).encode()
            assert any(re.search(rx, s) for s in syms), (variant, fp8, rows, rx)


def test_ncu_snippet_plans_with_the_kv_dtype():
    # auto picks anything but v2 only when plan() knows the KV dtype: the profiled child must pass it
    assert 'kv_dtype=inp["k_cache"].dtype' in D._NCU_SNIPPET and "assert p.variant ==" in D._NCU_SNIPPET


def test_bad_arguments_raise():
    from hotpaths.harness.shapes import CaseError

    with pytest.raises(CaseError):
        D.decode_rows(["64y4K"], log=None)
    with pytest.raises(ValueError, match="impls"):
        D.decode_rows(["1x64"], impls=("nope",), log=None)
    with pytest.raises(ValueError, match="kv_dtypes"):
        D.decode_rows(["1x64"], kv_dtypes=("fp16",), log=None)


def test_skew_lengths_keep_total_and_grow():
    from hotpaths.harness.shapes import expand_lengths, format_case

    total = 32 * 4096
    shares = []
    for f in (1 / 32, 0.25, 0.5, 0.9):
        case = D.skew_lengths(total, f)
        lens = expand_lengths(format_case(case))
        assert sum(lens) == total and len(lens) == 32 and all(L % 64 == 0 and L > 0 for L in lens)
        shares.append(max(lens) / total)
    assert shares[0] == pytest.approx(1 / 32) and shares == sorted(shares) and shares[-1] > 0.85
    with pytest.raises(ValueError, match="total_tokens"):
        D.skew_lengths(1000, 0.5)
    with pytest.raises(ValueError, match="long_fraction"):
        D.skew_lengths(total, 1.0)


def test_case_numbers_bytes_and_floor():
    rows = D.case_numbers(["64x4K"], ceilings={"copy_gbps": 4000.0})
    fp8, bf16 = rows
    assert fp8["kv_mb"] == pytest.approx(64.0) and bf16["kv_mb"] == pytest.approx(128.0)
    assert fp8["floor_us"] == pytest.approx(fp8["bytes"] / 4000.0 / 1e3)


@pytest.mark.parametrize("kv_dtype", ["fp8", "bf16"])
@pytest.mark.parametrize("q_len", [1, 2])
def test_gathered_peers_match_reference_on_cpu(kv_dtype, q_len):
    # kv_len 0, 1 (< q_len for MTP), non-multiples of the page, GQA 4:1 with 2 kv heads; NaN-poisoned unused slots
    inp = make_decode_inputs([1, 63, 200, 0, 130], q_heads=8, kv_heads=2, head_dim=64, page_size=16, q_len=q_len,
                             kv_dtype=kv_dtype, seed=3)
    ref = split_kv_decode_ref(**inp)
    for fn in (P.make_torch_sdpa_gathered(inp, allow_cpu=True),
               P.make_flex_attention_decode(inp, allow_cpu=True, compile=False)):
        res = check(fn(), ref, op="split_kv_decode", path=f"{kv_dtype}_vs_exact")
        assert res.passed, res


def test_ncu_rows_say_unavailable_without_gpu():
    if not CPU_ONLY:
        pytest.skip("CPU behaviour")
    with pytest.warns(RuntimeWarning):
        rows = D.ncu_rows(["1x64"])
    assert rows[0]["note"].startswith("unavailable")


def test_flex_peer_compiled_path_matches_reference():
    """The torch.compile path the GPU run uses (a shadowed `k` once broke it only there)."""
    import torch

    from hotpaths.bench import split_kv_decode_peers as peers
    from hotpaths.harness.check import check
    from hotpaths.reference.split_kv_decode import make_decode_inputs, split_kv_decode_ref

    inp = make_decode_inputs([100, 70, 0], kv_dtype="bf16", device="cpu", seed=3)
    fn = peers.make_flex_attention_decode(inp, allow_cpu=True, compile=True)
    out = fn()
    assert torch.isfinite(out).all()
    assert check(out, split_kv_decode_ref(**inp), op="split_kv_decode", path="bf16_vs_exact").passed


def test_overhead_rows_cpu_name_every_stage_with_reason():
    """decode_fixed_costs: assign per batch, the floor, and step / attention_only / combine_only per stage case; on
    CPU every timing is None and the note says why."""
    from hotpaths.bench import split_kv_decode as db

    rows = db.overhead_rows((1, 8), stage_cases=("64x0.5K", "1x4K+7x0.5K"))
    impls = [(r["case"], r["impl"]) for r in rows]
    assert impls[:2] == [("1x4K", "assign_only"), ("8x4K", "assign_only")]
    for case in ("64x0.5K", "1x4K+7x0.5K"):
        assert [i for c, i in impls if c == case] == ["step", "attention_only", "combine_only"]
    stage = [r for r in rows if r["impl"] in ("step", "attention_only", "combine_only")]
    assert all(r.get("median_us") is None for r in stage)
    assert all(r["note"].startswith("not timed:") for r in stage)


def test_auto_variant_choice_on_the_published_cases():
    """variant="auto": v3s2c4 (finer grid) where the longest (head, request) stays within AUTO_MAX_CHUNKS chunks at
    its budget, v2 where one long request dominates (the choice the H200 A/B runs support), and v2 without reading
    anything for BF16 / unknown dtype, the static modes or an explicit grid."""
    import torch

    from hotpaths.harness.shapes import expand_lengths, parse_cases
    from hotpaths.kernels import split_kv_decode as K

    want = {"64x0.5K": "v3s2c4", "64x4K": "v3s2c4", "32x0.125K+32x4K": "v3s2c4", "2x32K+30x4K": "v3s2c4",
            "1x64K+15x4K": "v2", "1x128K+31x4K": "v2", "1x16K+15x64": "v2", "1x64K+7x4K": "v2", "1x64K+31x4K": "v2"}
    for case, v in want.items():
        lens = torch.tensor(expand_lengths(parse_cases(case)), dtype=torch.int32)
        assert K.choose_variant(lens, num_kv_heads=1, kv_dtype="fp8", num_sms=132) == v, case
        assert K.choose_variant(lens, num_kv_heads=1, kv_dtype=torch.float8_e4m3fn, num_sms=132) == v, case
        assert K.choose_variant(lens, num_kv_heads=1, kv_dtype="bf16", num_sms=132) == "v3b", case
        assert K.choose_variant(lens, num_kv_heads=1, kv_dtype=torch.bfloat16, num_sms=132) == "v3b", case
        for kw in (dict(kv_dtype=None), dict(kv_dtype="fp8", mode="static_count"), dict(kv_dtype="fp8", num_ctas=264),
                   dict(kv_dtype="bf16", mode="static_chunk"), dict(kv_dtype="bf16", num_ctas=264)):
            assert K.choose_variant(lens, num_kv_heads=1, num_sms=132, **kw) == K.AUTO_FALLBACK, (case, kw)
    # BF16's fuse-all estimate at v3b's grid (2 per SM, 264 CTAs): 64x0.5K 4 + 1, 64x4K 4 + 1 and
    # 32x0.125K+32x4K 8 + 1 fuse; 1x128K+31x4K (128 + 1) keeps the combine
    for case, longest in (("64x0.5K", 5), ("64x4K", 5), ("32x0.125K+32x4K", 9), ("1x128K+31x4K", 129)):
        lens = torch.tensor(expand_lengths(parse_cases(case)), dtype=torch.int32)
        assert K._auto_choice(lens, num_kv_heads=1, kv_dtype="bf16", num_sms=132) == ("v3b", longest), case
    # the estimate behind fuse-all (AUTO_FUSE_ALL_MAX_CHUNKS): 64x4K 8 + 1, 64x0.5K 4 + 1, 32x0.125K+32x4K 16 + 1
    for case, longest in (("64x4K", 9), ("64x0.5K", 5), ("32x0.125K+32x4K", 17)):
        lens = torch.tensor(expand_lengths(parse_cases(case)), dtype=torch.int32)
        assert K._auto_choice(lens, num_kv_heads=1, kv_dtype="fp8", num_sms=132) == ("v3s2c4", longest), case
    assert K.FUSE_ALL == 1 << 20 and K.AUTO_FUSE_ALL_MAX_CHUNKS == 9  # fuses 64x4K (9) and 64x0.5K (5), not 17
    # the boundary: chunks of the longest pair = ceil(tiles / budget) + 1 against AUTO_MAX_CHUNKS
    lens = torch.tensor([127 * 64 * 2], dtype=torch.int32)  # 254 tiles alone: budget 2 -> 128 chunks
    assert K.choose_variant(lens, num_kv_heads=1, kv_dtype="fp8", num_sms=132) == "v3s2c4"
    lens = torch.tensor([128 * 64 * 2], dtype=torch.int32)  # 256 tiles: budget 2 -> 129 chunks
    assert K.choose_variant(lens, num_kv_heads=1, kv_dtype="fp8", num_sms=132) == "v2"
    assert K.choose_variant(torch.zeros(4, dtype=torch.int32), num_kv_heads=1, kv_dtype="fp8", num_sms=132) == "v2"
    with pytest.raises(ValueError, match="kv_dtype"):
        K.choose_variant(lens, num_kv_heads=1, kv_dtype="fp16", num_sms=132)
    assert K.resolve_variant("auto") == "auto" and K.DEFAULT_VARIANT == "auto"
    with pytest.raises(ValueError, match="auto"):
        K.resolve_variant("fastest")



def test_resolve_early_argument_and_environment(monkeypatch):
    """plan(early=None) reads $HOTPATHS_DECODE_EARLY: unset -> on, "0" -> the old launches; an argument wins; any
    other value is refused naming the variable (CPU: no plan is built)."""
    from hotpaths.kernels import split_kv_decode as K

    monkeypatch.delenv(K.EARLY_ENV, raising=False)
    assert K.resolve_early() is True
    assert K.resolve_early(False) is False
    monkeypatch.setenv(K.EARLY_ENV, "0")
    assert K.resolve_early() is False and K.resolve_early(True) is True
    monkeypatch.setenv(K.EARLY_ENV, "1")
    assert K.resolve_early() is True
    monkeypatch.setenv(K.EARLY_ENV, "yes")
    with pytest.raises(ValueError, match="HOTPATHS_DECODE_EARLY"):
        K.resolve_early()
    assert K.DecodePlan.__dataclass_fields__["early"].default is True

def test_cli_q_len_and_dtype_lists_and_hpc_rows():
    import json
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "hotpaths", "decode", "--cases", "2x100", "--kv-dtype", "fp8,bf16",
                        "--q-len", "1,2", "--impl", "dynamic,hpc_ops_dynamic,flashinfer_xqa", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
    assert {(row["dtype"], row["q_len"]) for row in rows} == {(d, q) for d in ("fp8_kv", "bf16_kv") for q in (1, 2)}
    assert all(f"--q-len {row['q_len']}" in row["repro"] for row in rows)
    hpc = [row for row in rows if row["impl"] == "hpc_ops_dynamic"]
    assert len(hpc) == 4 and all(row["note"].startswith("not available") for row in hpc)
    bad = subprocess.run([sys.executable, "-m", "hotpaths", "decode", "--cases", "1x64", "--q-len", "1,5"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--q-len" in bad.stderr


def test_auto_variant_choice_above_eight_rows():
    """variant="auto" with more than 8 query rows per pair (q_len x GQA ratio: MTP at 8:1): v3m (one row group of up
    to 16 rows, 2 CTAs per SM) where its grid keeps the longest pair within AUTO_MTP_MAX_CHUNKS (16) chunks (v3w in
    its place where a CTA of that grid holds AUTO_MTP_WG_MIN_DESCS (3) descriptors or more: 32x0.125K+32x4K), v2 at
    9-16 rows above that (one or two long requests among short ones); above 16 rows (8:1 at q_len 3-4) the
    warpgroup-MMA kernel whatever the chunk estimate: v3wc3 where its 3-per-SM grid gives every CTA one descriptor and
    v3w's 2-per-SM grid does not (2x32K+30x4K, 1x64K+7x4K, 1x64K+31x4K of the nine), else v3w; 8 rows (q_len 1 at
    8:1) keep today's choice (v3s2c4 / v2) exactly."""
    import torch

    from hotpaths.harness.shapes import expand_lengths, parse_cases
    from hotpaths.kernels import split_kv_decode as K
    from hotpaths.reference import split_kv_decode as R

    want = {"64x0.5K": ("v3m", 5), "64x4K": ("v3m", 5), "32x4K": ("v3m", 9), "32x0.125K+32x4K": ("v3w", 9),
            "2x32K+30x4K": ("v2", 44), "1x64K+31x4K": ("v2", 87), "1x128K+31x4K": ("v2", 129),
            "1x16K+15x64": ("v2", 129), "1x64K+7x4K": ("v2", 172), "1x64K+15x4K": ("v2", 129)}
    fine = ("2x32K+30x4K", "1x64K+7x4K", "1x64K+31x4K")
    for case, (v, longest) in want.items():
        lens = torch.tensor(expand_lengths(parse_cases(case)), dtype=torch.int32)
        for rows in (12, 16):
            assert K._auto_choice(lens, num_kv_heads=1, kv_dtype="fp8", num_sms=132, rows=rows) == (v, longest)
        descs = [int(R.build_task_map(lens.tolist(), 1, c, min_tiles=2).per_cta_descs().max()) for c in (264, 396)]
        assert (descs[1] <= 1 < descs[0]) == (case in fine), (case, descs)
        fine_longest = K._longest_chunks([-(-int(x) // K.TILE) for x in lens.tolist()], 1, 396, 2)
        for rows in (17, 24, 32, 64):  # the chunk estimate at the chosen grid is still reported (fuse-all reads it)
            assert K._auto_choice(lens, num_kv_heads=1, kv_dtype="fp8", num_sms=132, rows=rows) == (
                ("v3wc3", fine_longest) if case in fine else ("v3w", longest)), case
            assert K.choose_variant(lens, num_kv_heads=1, kv_dtype="fp8", num_sms=132, rows=rows, mode="static_count",
                                    ) == K.AUTO_FALLBACK  # dynamic mode only
        got8 = K.choose_variant(lens, num_kv_heads=1, kv_dtype="fp8", num_sms=132, rows=8)
        assert got8 == K.choose_variant(lens, num_kv_heads=1, kv_dtype="fp8", num_sms=132) != "v3m", case
        for rows in (16, 32):  # BF16 above 8 rows: v3w (its bf16 form), the estimate at its 2-per-SM grid
            assert K._auto_choice(lens, num_kv_heads=1, kv_dtype="bf16", num_sms=132, rows=rows) == (
                "v3w", K._longest_chunks([-(-int(x) // K.TILE) for x in lens.tolist()], 1, 264, 2)), case
    assert K.AUTO_MTP in K.MTP_CONFIGS and set(K.MTP_CONFIGS) <= set(K.V3_CONFIGS)
    assert {K.AUTO_MTP_WG, K.AUTO_MTP_WG_FINE} == set(K.WG_CONFIGS) <= set(K.MTP_CONFIGS)
    assert K.AUTO_MTP_ALWAYS_ROWS == 16 and K.AUTO_MTP_MAX_CHUNKS == 16 and K.AUTO_MTP_WG_MIN_DESCS == 3
    # 9-16 rows: v3w in v3m's place once a CTA of the 2-per-SM grid holds 3+ descriptors (short pairs among long)
    for case, descs in (("32x0.125K+32x4K", 4), ("64x4K", 1), ("64x0.5K", 1), ("32x4K", 1)):
        tl = [-(-int(x) // K.TILE) for x in expand_lengths(parse_cases(case))]
        assert K._max_descs_per_cta(tl, 1, 264, 2) == descs, case
    mixed = torch.tensor([2 * K.TILE] * 8 + [24 * K.TILE] * 8, dtype=torch.int32)  # 208 tiles, budget 2
    tl = [-(-int(x) // K.TILE) for x in mixed.tolist()]
    assert K._max_descs_per_cta(tl, 1, 264, 2) == 1  # two-tile pairs fill one bin each: v3m stays
    assert K._auto_choice(mixed, num_kv_heads=1, kv_dtype="fp8", num_sms=132, rows=16)[0] == "v3m"
    # the bound is inclusive and applies at 9-16 rows only (8 rows keep AUTO_MAX_CHUNKS)
    # (264 CTAs, budget 2 tiles: longest = ceil(29 / 2) + 1 = 16, ceil(32 / 2) + 1 = 17)
    at16 = torch.tensor([29 * K.TILE] + [8 * K.TILE] * 15, dtype=torch.int32)
    at17 = torch.tensor([2 * K.TILE] + [32 * K.TILE] * 15, dtype=torch.int32)
    assert K._auto_choice(at16, num_kv_heads=1, kv_dtype="fp8", num_sms=132, rows=16) == ("v3m", 16)
    assert K._auto_choice(at17, num_kv_heads=1, kv_dtype="fp8", num_sms=132, rows=16) == ("v2", 17)
    assert K._auto_choice(at17, num_kv_heads=1, kv_dtype="fp8", num_sms=132, rows=8)[0] == "v3s2c4"
    # KV heads count as pairs: 64:8 (8 rows per KV head and query token) puts 8 pairs per request into the map.
    # Wide plans (a 2-per-SM budget of >= AUTO_WIDE_BUDGET tiles): v3wc3 above 16 rows; at 9-16 rows v2, or v3wc3
    # with >= AUTO_WIDE_FINE_DESCS descriptors on a CTA; the narrow ones keep the rules above
    assert (K.AUTO_WIDE_BUDGET, K.AUTO_WIDE_FINE_DESCS) == (32, 8)
    want64 = {"64x0.5K": (16, "v3m", "v3w"), "64x4K": (125, "v2", "v3wc3"), "32x0.125K+32x4K": (64, "v3wc3", "v3wc3"),
              "2x32K+30x4K": (90, "v2", "v3wc3"), "1x64K+15x4K": (61, "v2", "v3wc3"),
              "1x128K+31x4K": (123, "v2", "v3wc3"), "1x16K+15x64": (9, "v2", "v3w"),
              "1x64K+7x4K": (45, "v2", "v3wc3"), "1x64K+31x4K": (92, "v2", "v3wc3")}
    for case, (budget, v16, v32) in want64.items():
        lens = torch.tensor(expand_lengths(parse_cases(case)), dtype=torch.int32)
        tiles = [-(-int(x) // K.TILE) for x in lens.tolist()]
        assert max(-(-sum(tiles) * 8 // 264), 2) == budget, case
        assert K.choose_variant(lens, num_kv_heads=8, kv_dtype="fp8", num_sms=132, rows=16) == v16, case
        for rows in (24, 32):
            got = K._auto_choice(lens, num_kv_heads=8, kv_dtype="fp8", num_sms=132, rows=rows)
            assert got[0] == v32, case
            if v32 == "v3wc3":  # the estimate fuse-all reads is at v3wc3's own 3-per-SM grid
                assert got[1] == K._longest_chunks(tiles, 8, 396, 2), case
        assert K.choose_variant(lens, num_kv_heads=8, kv_dtype="fp8", num_sms=132, rows=8) == "v3s2c4", case
        assert K.choose_variant(lens, num_kv_heads=8, kv_dtype="bf16", num_sms=132, rows=32) == "v3w", case
    # the budget bound is inclusive: 264 pairs of 32 tiles (budget 32: wide) against 264 of 31 (budget 31: the
    # descriptor rule, one descriptor per CTA of v3w's grid and two on v3wc3's: v3w)
    for t, v in ((32, "v3wc3"), (31, "v3w")):
        lens = torch.tensor([t * K.TILE] * 264, dtype=torch.int32)
        assert K.choose_variant(lens, num_kv_heads=1, kv_dtype="fp8", num_sms=132, rows=32) == v, t
    assert set(K.ROW_CONFIGS) == {"v2"} and not set(K.ROW_CONFIGS) & set(K.V3_CONFIGS)
    assert set(K.CONFIGS) == set(K.VARIANTS) and len(set(K.CONFIGS.values())) == len(K.CONFIGS)
    assert "v2" not in K.ONLINE_COMBINE and {"v3m", "v3s2c4"} <= set(K.ONLINE_COMBINE)
    assert not {"v3ms4c1", "v2f", "v2fs3c1", "v2fs4c1"} & set(K.VARIANTS)  # measured and removed


def test_max_descs_per_cta_matches_the_host_map():
    """_max_descs_per_cta (auto's v3w / v3wc3 rule) equals the host task map's most descriptors per CTA on random
    batches (zero-length requests, several KV heads, budgets floored by min_tiles), and 0 for an empty batch."""
    import numpy as np

    from hotpaths.kernels import split_kv_decode as K
    from hotpaths.reference import split_kv_decode as R

    rng = np.random.default_rng(5)
    for _ in range(200):
        lens = [int(x) for x in rng.integers(0, 20000, int(rng.integers(1, 40)))]
        lens[int(rng.integers(0, len(lens)))] = 0
        H, C, F = int(rng.integers(1, 9)), int(rng.integers(1, 400)), int(rng.integers(1, 5))
        tiles = [-(-n // K.TILE) for n in lens]
        want = int(R.build_task_map(lens, H, C, min_tiles=F).per_cta_descs().max())
        assert K._max_descs_per_cta(tiles, H, C, F) == want, (lens, H, C, F)
    assert K._max_descs_per_cta([0, 0], 2, 10, 2) == 0


def test_mtp_summary_and_rows_arguments():
    """mtp_summary: per (dtype, q_len) the geomean / minimum of our rows' same-run vs_hpc_ops (with the case of the
    minimum) and of XQA's time over ours, rows without numbers left out; mtp_rows refuses a q_len outside 1..4 or an
    unknown dtype before measuring anything."""
    import math

    rows = [dict(case="a", q_len=1, impl="dynamic", median_us=10.0, vs_hpc_ops=1.2),
            dict(case="b", q_len=1, impl="dynamic", median_us=20.0, vs_hpc_ops=0.9),
            dict(case="a", q_len=1, impl="flashinfer_xqa", median_us=30.0, vs_hpc_ops=None),
            dict(case="b", q_len=1, impl="flashinfer_xqa", median_us=None, vs_hpc_ops=None),
            dict(case="a", q_len=3, impl="dynamic", median_us=5.0, vs_hpc_ops=None),
            dict(case="a", q_len=3, impl="hpc_ops_dynamic", median_us=6.0, vs_hpc_ops=None)]
    s1, s3 = D.mtp_summary(rows)
    assert s1["q_len"] == 1 and s1["cases"] == 2
    assert math.isclose(s1["geomean_vs_hpc_ops"], math.sqrt(1.2 * 0.9)) and s1["min_vs_hpc_ops"] == 0.9
    assert s1["min_case_hpc_ops"] == "b" and math.isclose(s1["geomean_vs_xqa"], 3.0) and s1["min_case_xqa"] == "a"
    assert s3["q_len"] == 3 and s3["geomean_vs_hpc_ops"] is None and s3["geomean_vs_xqa"] is None
    assert s1["dtype"] is None
    # with a dtype column: one group per (dtype, q_len), dtypes never pooled
    rows2 = [dict(r, dtype="fp8_kv") for r in rows] + [dict(case="a", q_len=1, impl="dynamic", median_us=8.0,
                                                             vs_hpc_ops=2.0, dtype="bf16_kv")]
    got = D.mtp_summary(rows2)
    assert [(g["dtype"], g["q_len"]) for g in got] == [("bf16_kv", 1), ("fp8_kv", 1), ("fp8_kv", 3)]
    assert got[0]["geomean_vs_hpc_ops"] == 2.0 and got[0]["cases"] == 1
    assert math.isclose(got[1]["geomean_vs_hpc_ops"], math.sqrt(1.2 * 0.9))
    with pytest.raises(ValueError, match="q_lens"):
        D.mtp_rows(["64x4K"], q_lens=(1, 5))
    with pytest.raises(ValueError, match="kv_dtypes"):
        D.mtp_rows(["64x4K"], kv_dtypes=("fp16",))
