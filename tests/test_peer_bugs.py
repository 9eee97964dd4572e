"""The bugs our peers shipped, each as a named test of our ops: on the CPU where the reference shows the property,
on the GPU (marker gpu) for the kernels. The GPU cases run through the fuzz runners (hotpaths.bench.<op>_fuzz):
guarded buffers, poisoned outputs, comparison with the emulation."""

import sys
import textwrap

import numpy as np
import pytest
import torch
from bounded_child import run_child

from hotpaths.bench import attention_prologue_fuzz as PF
from hotpaths.bench import split_kv_decode_fuzz as DF
from hotpaths.reference import attention_prologue as pref
from hotpaths.reference import fused_moe as fm
from hotpaths.reference import split_kv_decode as dref


def _no_failures(res):
    assert not res["failures"], "\n".join(res["failures"])


def _decode_cfg(lens, **kw):
    cfg = dict(lens=lens, gqa=8, kv_heads=1, head_dim=128, page_size=64, q_len=1, kv_dtype="fp8", num_ctas=132,
               min_tiles=2, seed=0, mode="dynamic", variant="v3", fuse_max=0)
    cfg.update(kw)
    return cfg


def _moe_cfg(tokens, **kw):
    cfg = dict(tokens=tokens, mode="tp8ep1", experts=16, topk=8, rank=0, hidden=512, inter=192, scales="block",
               routing="random", block_m=16, spare_tokens=0, seed=0, kernel=True)
    cfg.update(kw)
    return cfg


# ---------------------------------------------------------------------------------------------------------------
# HPC-Ops decode: illegal memory access at page size 32

def test_decode_page_32_reference():
    _no_failures(DF.check_cpu(_decode_cfg([1, 31, 32, 33, 95, 300], page_size=32)))


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["v2", "v3", "v3s3c3"])
@pytest.mark.parametrize("kv_dtype", ["fp8", "bf16"])
def test_decode_page_32_kernel(variant, kv_dtype):
    _no_failures(DF.fuzz_run(_decode_cfg([1, 31, 32, 33, 95, 4000, 2047], page_size=32, variant=variant,
                                         kv_dtype=kv_dtype)))


# ---------------------------------------------------------------------------------------------------------------
# HPC-Ops block-wise MoE: illegal memory access at intermediate 192 from 32 tokens

@pytest.mark.parametrize("tokens", [32, 33])
def test_moe_block_inter_192_from_32_tokens_reference(tokens):
    from hotpaths.bench import fused_moe_fuzz as MF

    _no_failures(MF.check_cpu(_moe_cfg(tokens, hidden=256, experts=8, topk=4)))


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [31, 32, 33, 64, 128, 512])
def test_moe_block_inter_192_from_32_tokens_kernel(tokens):
    from hotpaths.bench import fused_moe_fuzz as MF

    _no_failures(MF.fuzz_run(_moe_cfg(tokens)))


# ---------------------------------------------------------------------------------------------------------------
# NaN at q_len 5: we reject q_len outside 1..4 cleanly, before anything is allocated or launched

def test_q_len_5_rejected_by_reference():
    with pytest.raises(ValueError, match="q_len"):
        dref.make_decode_inputs([100], q_len=5)
    d = dref.make_decode_inputs([100, 100, 100, 100, 100], q_len=1)  # 5 query rows: one request at q_len 5
    with pytest.raises(ValueError, match="q_len"):
        dref.split_kv_decode_ref(**dict(d, q_len=5, kv_lens=d["kv_lens"][:1], block_table=d["block_table"][:1]))


def test_q_len_5_rejected_by_kernel_api():
    from hotpaths.kernels import split_kv_decode as K

    d = dref.make_decode_inputs([100], q_len=4)
    with pytest.raises(ValueError, match="q_len"):
        K.split_kv_decode(d["q"], d["k_cache"], d["v_cache"], d["block_table"], d["kv_lens"], q_len=5,
                          q_scale=d["q_scale"], k_scale=d["k_scale"], v_scale=d["v_scale"])


@pytest.mark.gpu
def test_q_len_5_rejected_by_plan():
    from hotpaths.kernels import split_kv_decode as K

    with pytest.raises(ValueError, match="q_len"):
        K.plan(torch.tensor([100], dtype=torch.int32, device="cuda"), num_kv_heads=1, q_heads=8, q_len=5)


# ---------------------------------------------------------------------------------------------------------------
# Undersized task-map workspace: our plan sizes its own; a larger batch than it was sized for is refused

def test_task_map_refuses_more_pairs_than_sized():
    with pytest.raises(ValueError, match="max_pairs"):
        dref.build_task_map([64] * 8, 1, 16, max_pairs=4)


@pytest.mark.gpu
def test_plan_update_beyond_max_batch_raises():
    from hotpaths.kernels import split_kv_decode as K

    p = K.plan(torch.tensor([64] * 4, dtype=torch.int32, device="cuda"), num_kv_heads=1, q_heads=8, max_batch=4)
    with pytest.raises(ValueError, match="max_batch"):
        p.update(torch.tensor([64] * 8, dtype=torch.int32, device="cuda"))


@pytest.mark.gpu
def test_moe_plan_update_beyond_max_tokens_raises():
    from hotpaths.kernels import fused_moe as K

    ids = torch.zeros(4, 2, dtype=torch.int32, device="cuda")
    p = K.plan(ids, num_experts=8, max_tokens=4)
    with pytest.raises(ValueError, match="max_tokens"):
        p.update(torch.zeros(9, 2, dtype=torch.int32, device="cuda"))


# ---------------------------------------------------------------------------------------------------------------
# MoE hang at 2048 tokens: the plan and the layer complete (the GPU run in a child with a timeout)

def test_moe_2048_tokens_plan():
    gen = np.random.default_rng(0)
    ids = np.stack([gen.permutation(64)[:8] for _ in range(2048)]).astype(np.int32)
    plan = fm.build_routing_plan(ids, num_experts=64, block_m=64)
    assert fm.check_plan(plan, ids) == []
    assert plan.num_valid == 2048 * 8


@pytest.mark.gpu
def test_moe_2048_tokens_completes():
    code = textwrap.dedent("""
        import torch
        from hotpaths.reference import fused_moe as fm
        from hotpaths.kernels import fused_moe as K
        for scales in ("pertensor", "block"):
            d = fm.make_moe_inputs(2048, experts=64, topk=8, hidden=1024, inter=8 * 192, scales=scales, device="cuda")
            args, kw = fm.call_args(d)
            out = K.fused_moe(*args, **kw)
            torch.cuda.synchronize()
            assert torch.isfinite(out).all(), scales
        print("completed")
    """)
    proc = run_child([sys.executable, "-c", code], what="MoE at 2048 tokens")  # a hang fails, bounded
    assert proc.returncode == 0 and "completed" in proc.stdout, proc.stderr[-2000:]


# ---------------------------------------------------------------------------------------------------------------
# kv_len-0 padding producing NaN (FlashInfer / FA3): a request of length 0 gives zeros, its neighbours are right

@pytest.mark.parametrize("kv_dtype", ["fp8", "bf16"])
def test_kv_len_0_rows_are_zero_reference(kv_dtype):
    d = dref.make_decode_inputs([0, 100, 0, 0, 65], kv_dtype=kv_dtype, q_len=2)
    for out in (dref.split_kv_decode_ref(**d), dref.split_kv_decode_emulation(**d)):
        out = out.float()
        assert torch.isfinite(out).all()
        assert (out.view(5, 2, 8, 128)[[0, 2, 3]] == 0).all()
    _no_failures(DF.check_cpu(_decode_cfg([0, 100, 0, 0, 65], kv_dtype=kv_dtype, q_len=2)))


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["dynamic", "static_count", "batch_invariant"])
def test_kv_len_0_rows_kernel(mode):
    _no_failures(DF.fuzz_run(_decode_cfg([0, 100, 0, 0, 65, 0], mode=mode, q_len=2)))
    _no_failures(DF.fuzz_run(_decode_cfg([0, 0, 0], mode=mode)))


# ---------------------------------------------------------------------------------------------------------------
# Masked V slots holding NaN: the unused slots of every last page are NaN; the output stays finite and right

@pytest.mark.parametrize("kv_dtype", ["fp8", "bf16"])
def test_masked_nan_slots_reference(kv_dtype):
    lens = [1, 63, 65, 130]
    d = dref.make_decode_inputs(lens, kv_dtype=kv_dtype, page_size=64)
    v = d["v_cache"]
    bits = v.view(torch.uint8) if kv_dtype == "fp8" else None
    for r, L in enumerate(lens):  # the poison really is there, right after each request's last token
        page = int(d["block_table"][r, L // 64])
        slot = L % 64
        if kv_dtype == "fp8":
            assert (bits[page, slot] == 0x7F).all()
        else:
            assert torch.isnan(v[page, slot].float()).all()
    _no_failures(DF.check_cpu(_decode_cfg(lens, kv_dtype=kv_dtype)))


@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype", ["fp8", "bf16"])
@pytest.mark.parametrize("page_size", [16, 32, 64, 128])
def test_masked_nan_slots_kernel(kv_dtype, page_size):
    _no_failures(DF.fuzz_run(_decode_cfg([1, page_size - 1, page_size + 1, 3 * page_size + 7], kv_dtype=kv_dtype,
                                         page_size=page_size)))


# ---------------------------------------------------------------------------------------------------------------
# An FP8 per-tensor / per-row scale poisoned by a NaN pad row: pads full of NaN change nothing else

def _prologue_nan_pad_case():
    cfg = dict(tokens=24, q_heads=8, kv_heads=1, head_dim=128, rotary_dim=128, page_size=64, norm_order="norm_rope",
               rope="neox", kv_dtype="fp8", q_dtype="fp8", pad_every=3, nan_pads=True, seed=0)
    return cfg


def test_nan_pad_row_does_not_poison_scales_reference():
    cfg = _prologue_nan_pad_case()
    clean = PF.make_inputs(dict(cfg, nan_pads=False))
    dirty = PF.make_inputs(cfg)
    pads = dirty["slot_mapping"] < 0
    assert torch.isnan(dirty["qkv"][pads].float()).all() and bool(pads.any())
    q0, s0, k0, v0 = PF._call(pref.attention_prologue_emulation, clean)
    q1, s1, k1, v1 = PF._call(pref.attention_prologue_emulation, dirty)
    assert torch.equal(s0[~pads], s1[~pads]) and torch.isfinite(s1[~pads]).all()
    assert torch.equal(q0[~pads].view(torch.uint8), q1[~pads].view(torch.uint8))
    assert torch.equal(k1.view(torch.uint8), k0.view(torch.uint8)) and torch.equal(v1.view(torch.uint8),
                                                                                   v0.view(torch.uint8))
    _no_failures(PF.check_cpu(cfg))


@pytest.mark.gpu
@pytest.mark.parametrize("q_dtype", ["fp8", "bf16"])
def test_nan_pad_row_does_not_poison_scales_kernel(q_dtype):
    _no_failures(PF.fuzz_run(dict(_prologue_nan_pad_case(), q_dtype=q_dtype, kernel=True)))
    _no_failures(PF.fuzz_run(dict(_prologue_nan_pad_case(), tokens=300, pad_every=1, kernel=True)))  # all pads


# ---------------------------------------------------------------------------------------------------------------
# Duplicate top-k ids (a CUTLASS MoE crashed on them)

def test_moe_duplicate_topk_ids_reference():
    from hotpaths.bench import fused_moe_fuzz as MF

    ids = np.array([[3, 3, 3, 3], [0, 1, 0, 1], [-1, 2, 2, -1]], dtype=np.int32)
    plan = fm.build_routing_plan(ids, num_experts=4, block_m=8)
    assert MF.plan_failures(ids, plan, 4, 0) == []
    assert plan.num_valid == 10 and plan.expert_counts.tolist() == [2, 2, 2, 4]
    _no_failures(MF.check_cpu(_moe_cfg(17, routing="duplicates", experts=8, topk=4, hidden=128, inter=64)))


@pytest.mark.gpu
@pytest.mark.parametrize("scales", ["pertensor", "block"])
def test_moe_duplicate_topk_ids_kernel(scales):
    from hotpaths.bench import fused_moe_fuzz as MF

    _no_failures(MF.fuzz_run(_moe_cfg(64, routing="duplicates", scales=scales)))
    ids = [[5] * 8] * 3 + [[-1] * 8]  # every slot of a token on one expert, and a token with no slot
    _no_failures(MF.fuzz_run(_moe_cfg(4, routing="drawn", ids=ids, scales=scales)))
