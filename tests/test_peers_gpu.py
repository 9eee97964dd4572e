"""GPU tests of the same-run peers and of the router's tune-on-first-use (SM90 only; skipped elsewhere with the
reason). A peer whose bundle is absent (HOTPATHS_HPC_OPS_DIR / HOTPATHS_FLASHINFER_072_DIR unset: source
tools/gpu/peers_env.sh first) skips with its PeerUnavailable reason."""

from __future__ import annotations

import pytest
import torch

from hotpaths.bench import router_gemm_peers as RP
from hotpaths.bench import split_kv_decode_peers as P
from hotpaths.harness.check import check
from hotpaths.harness.env import requires_sm90
from hotpaths.reference import router_gemm as rref
from hotpaths.reference.split_kv_decode import make_decode_inputs, split_kv_decode_ref

pytestmark = [pytest.mark.gpu, requires_sm90()]

# the peers' own accuracy vs the fp64 reference (PEERS.md: HPC-Ops FP8 ~2e-2, XQA FP8 ~3.5e-2 rel L2)
PEER_REL_L2 = {"fp8": 6e-2, "bf16": 1e-2}


def _make_or_skip(name, inp):
    fn, why = P.try_make(name, inp)
    if fn is None:
        pytest.skip(why)
    return fn


@pytest.mark.parametrize("kv", ["fp8", "bf16"])
@pytest.mark.parametrize("name,q_len", [(n, q) for n in ("hpc_ops_dynamic", "hpc_ops_static", "flashinfer_xqa",
                                                        "flashinfer_tc") for q in (1, 2, 4)
                                        # the decode wrapper is q_len 1 only (its reason is tested on CPU)
                                        if not (n == "flashinfer_tc" and q > 1)])
def test_decode_peer_matches_reference_and_replays_in_a_graph(name, kv, q_len):
    # skewed lengths, a non-multiple of the page, NaN-poisoned unused slots (the peers read a clean copy)
    inp = make_decode_inputs([4096, 700, 65, 130], q_heads=8, kv_heads=1, head_dim=128, page_size=64, q_len=q_len,
                             kv_dtype=kv, device="cuda", seed=11)
    ref = split_kv_decode_ref(**inp)
    fn = _make_or_skip(name, inp)
    out = fn()
    torch.cuda.synchronize()
    res = check(out, ref)
    assert res.nan_count == 0 and res.rel_l2_err < PEER_REL_L2[kv], (name, kv, q_len, res)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert check(out, ref).rel_l2_err == pytest.approx(res.rel_l2_err, rel=1e-3, abs=1e-6)


def test_router_hpc_ops_peer_matches_fp64():
    x, w = rref.make_router_inputs(256, 256, 4096, seed=3)
    x, w = x.cuda(), w.cuda()
    fn, why = RP.try_make("hpc_ops", x, w)
    if fn is None:
        pytest.skip(why)
    out = fn()
    r64 = x.double() @ w.double().T
    emu = rref.bf16x2_from_parts(x, *RP.hpc_ops_split(w))
    err = float((out.double() - r64).abs().max())
    # The adapter is right when the peer lands in the bf16x2 precision class of its own split: on the H200 its
    # kernel measured 2.3e-5 against 1.0e-5 for the exact-fp32 sum of that split (its accumulation order costs
    # ~2x), while a wrong split or layout gives BF16-weight error or worse (~100x and up).
    emu_err = float((emu.double() - r64).abs().max())
    bf16_err = float((x.double() @ w.bfloat16().double().T - r64).abs().max())
    assert err <= 8.0 * emu_err + 1e-6, (err, emu_err)
    assert err <= bf16_err / 20, (err, bf16_err)


def test_router_tune_on_first_use_unseen_shape(tmp_path, monkeypatch):
    from hotpaths.kernels import router_gemm as K

    monkeypatch.setenv("HOTPATHS_CACHE_DIR", str(tmp_path))
    K._TUNER = None
    try:
        n, k = 256, 2048  # not in the committed table
        _, w = rref.make_router_inputs(1, n, k, seed=1)
        weights = K.plan(w.cuda())
        x, _ = rref.make_router_inputs(1000, n, k, seed=2)
        x = x.cuda()
        # under capture: no tuning, the heuristic runs, nothing is cached
        K.set_tune_on_first_use(False)
        K.router_gemm(x, weights)  # eager warm-up of the heuristic path (sets kernel attributes), not tuned
        assert K.first_use_tuner().tunings == 0
        K.set_tune_on_first_use(True)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            K.router_gemm(x, weights)
        assert K.first_use_tuner().tunings == 0 and not K.first_use_tuner().cached(1000, n, k)
        # eager: tunes the bucket (M = 1024), caches it, and the result is correct
        out = K.router_gemm(x, weights)
        t = K.first_use_tuner()
        assert t.tunings == 1 and K.first_use_cache_path().exists()
        entry = t._load()[t.key(n, k, 1000)]
        assert entry["us"] <= entry["fp32_cublas_us"]  # never slower than FP32 cuBLAS as measured
        r64 = x.double() @ w.cuda().double().T
        emu = rref.bf16x2_from_parts(x, weights.w_high, weights.w_low)
        assert float((out.double() - r64).abs().max()) <= 1.5 * float((emu.double() - r64).abs().max()) + 1e-6
        # the captured graph of the tuned choice replays the same scores
        out2 = torch.full_like(out, float("nan"))
        g2 = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g2):
            K.router_gemm(x, weights, out=out2)
        g2.replay()
        torch.cuda.synchronize()
        assert torch.isfinite(out2).all() and t.tunings == 1
    finally:
        K._TUNER = None


@pytest.mark.parametrize("kv", ["fp8", "bf16"])
@pytest.mark.parametrize("q_len", [2, 3, 4])
def test_xqa_draft_mask_is_causal_on_short_requests(kv, q_len):
    # kv_len == q_len: draft 0 sees one key, so a mask that is not causal among the drafts moves the output by O(1);
    # the control (every draft seeing every draft, i.e. each row as its own q_len-1 request) proves the test can
    # tell the two apart at this tolerance
    lens = [q_len, q_len + 1, 65, 700]
    inp = make_decode_inputs(lens, q_heads=8, kv_heads=1, head_dim=128, page_size=64, q_len=q_len, kv_dtype=kv,
                             device="cuda", seed=13)
    ref = split_kv_decode_ref(**inp)
    non_causal = dict(inp, q_len=1, block_table=inp["block_table"].repeat_interleave(q_len, 0),
                      kv_lens=inp["kv_lens"].repeat_interleave(q_len, 0))
    assert check(split_kv_decode_ref(**non_causal), ref).rel_l2_err > 4 * PEER_REL_L2[kv]
    fn = _make_or_skip("flashinfer_xqa", inp)
    out = fn()
    torch.cuda.synchronize()
    res = check(out, ref)
    assert res.nan_count == 0 and res.rel_l2_err < PEER_REL_L2[kv], (kv, q_len, res)
