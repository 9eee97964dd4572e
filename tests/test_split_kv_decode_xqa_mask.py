"""CPU tests of the FlashInfer XQA peer at q_len > 1: the draft mask it is given (xqa_spec_dec_mask) must make XQA
see exactly what our decode sees (draft i of a request attends to kv_len - (q_len - 1 - i) tokens), in the bit
packing XQA reads, and the adapter must pass it with q_len_per_req. The mask is decoded by xqa_mask_visibility,
which follows the kernel's reading rule independently of how the mask was built."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from hotpaths.bench import split_kv_decode_peers as P
from hotpaths.harness.check import check
from hotpaths.reference.split_kv_decode import make_decode_inputs, split_kv_decode_ref


def _our_visibility(q_len, lens):
    """The rule stated in hotpaths.reference.split_kv_decode: token i sees positions p < kv_len - (q_len - 1 - i)."""
    vis = torch.zeros(len(lens), q_len, max(lens), dtype=torch.bool)
    for r, L in enumerate(lens):
        for i in range(q_len):
            vis[r, i, :L - (q_len - 1 - i)] = True
    return vis


@pytest.mark.parametrize("q_len,lens", [(2, [2, 3, 64, 65]), (3, [3, 7, 130]), (4, [4, 5, 6, 129, 700]),
                                        (33, [33, 40, 97])])
def test_mask_gives_our_causal_visibility(q_len, lens):
    mask = P.xqa_spec_dec_mask(q_len, lens)
    assert torch.equal(P.xqa_mask_visibility(mask, q_len, lens), _our_visibility(q_len, lens))


def test_mask_shape_dtype_and_packing():
    m = P.xqa_spec_dec_mask(4, torch.tensor([4, 9], dtype=torch.int32))
    assert m.dtype == torch.uint16 and tuple(m.shape) == (2, 4, 2) and m.is_contiguous()
    vals = (m.view(torch.int16).to(torch.int64) & 0xFFFF).tolist()
    # row i sets bits 0..i of its 32-bit word; the upper uint16 of the word is zero below 17 drafts
    assert vals == [[[1, 0], [3, 0], [7, 0], [15, 0]]] * 2
    # 33 drafts need two 32-bit words (four uint16) per row; draft 32 is bit 0 of the third uint16
    m = P.xqa_spec_dec_mask(33, [33])
    vals = (m.view(torch.int16).to(torch.int64) & 0xFFFF)[0]
    assert tuple(m.shape) == (1, 33, 4)
    assert vals[15].tolist() == [0xFFFF, 0, 0, 0] and vals[16].tolist() == [0xFFFF, 1, 0, 0]
    assert vals[31].tolist() == [0xFFFF, 0xFFFF, 0, 0] and vals[32].tolist() == [0xFFFF, 0xFFFF, 1, 0]


def test_decoder_tells_a_wrong_mask_apart():
    # a mask letting every draft see every draft (no causality) must not pass the visibility comparison
    q_len, lens = 3, [3, 10]
    full = torch.full((2, q_len, 2), 0, dtype=torch.int16)
    full[..., 0] = 0b111
    assert not torch.equal(P.xqa_mask_visibility(full.view(torch.uint16), q_len, lens), _our_visibility(q_len, lens))


@pytest.mark.parametrize("q_len,lens,match", [(1, [4], "q_len"), (True, [4], "q_len"), (2.0, [4], "q_len"),
                                              (3, [], "kv_lens"), (3, [5, 2], "kv_lens.*request 1 has 2")])
def test_mask_bad_input(q_len, lens, match):
    with pytest.raises(ValueError, match=match):
        P.xqa_spec_dec_mask(q_len, lens)


def test_visibility_rejects_a_mask_of_the_wrong_shape():
    with pytest.raises(ValueError, match="mask"):
        P.xqa_mask_visibility(P.xqa_spec_dec_mask(3, [4, 5]), 3, [4, 5, 6])


# ---------------------------------------------------------------------------------------------------------------
# the adapter on CPU, against a dense stand-in for XQA that honours its documented contract at q_len > 1

def _dense_xqa_standin(calls):
    def xqa(q, kv, ws, bt, seq, max_len, *, bmm1_scale, bmm2_scale, out, kv_layout, backend, q_len_per_req=1,
            mask=None):
        calls.append(dict(q_len_per_req=q_len_per_req, mask=mask, kv_layout=kv_layout, backend=backend))
        assert q_len_per_req == 1 or mask is not None, "Mask is required for speculative decoding"
        kc, vc = kv
        ps, Hk, D = kc.shape[1], kc.shape[2], kc.shape[3]
        lens = [int(v) for v in seq.tolist()]
        n = q_len_per_req
        vis = P.xqa_mask_visibility(mask, n, lens) if n > 1 else _our_visibility(1, lens)
        G = q.shape[1] // Hk
        for r, L in enumerate(lens):
            pages = bt[r, : -(-L // ps)].long()
            k = kc[pages].reshape(-1, Hk, D)[:L].float()
            v = vc[pages].reshape(-1, Hk, D)[:L].float()
            for i in range(n):  # request r owns rows r*n .. r*n + n - 1
                seen = vis[r, i, :L]
                for h in range(q.shape[1]):
                    s = (q[r * n + i, h].float() @ k[:, h // G].t()) * bmm1_scale
                    p = torch.softmax(s.masked_fill(~seen, float("-inf")), -1)
                    out[r * n + i, h] = (p @ v[:, h // G] * bmm2_scale).to(out.dtype)
        return out
    return xqa


@pytest.mark.parametrize("q_len", [1, 2, 4])
def test_adapter_passes_q_len_and_causal_mask(monkeypatch, q_len):
    calls = []
    fi = types.ModuleType("flashinfer")
    fi.__version__ = "stand-in"
    dec = types.ModuleType("flashinfer.decode")
    dec.trtllm_batch_decode_with_kv_cache = _dense_xqa_standin(calls)
    monkeypatch.setitem(sys.modules, "flashinfer", fi)
    monkeypatch.setitem(sys.modules, "flashinfer.decode", dec)
    monkeypatch.setattr(P, "import_flashinfer_072", lambda: fi)
    monkeypatch.setattr(P, "_need_cuda", lambda inputs, allow_cpu: None)
    monkeypatch.setattr(P, "run_once", lambda call, what: call())  # no CUDA synchronize on CPU
    # short requests (kv_len == q_len) make a wrong draft mask change the output far beyond bf16 rounding
    inp = make_decode_inputs([q_len, q_len + 1, 70], q_heads=8, kv_heads=1, head_dim=128, page_size=64,
                             q_len=q_len, kv_dtype="bf16", device="cpu", seed=5)
    fn = P.make_flashinfer_xqa(inp)
    out = fn()
    res = check(out, split_kv_decode_ref(**inp))
    assert res.nan_count == 0 and res.rel_l2_err < 1e-2, res
    last = calls[-1]
    assert (last["kv_layout"], last["backend"]) == ("NHD", "xqa")
    if q_len == 1:
        assert last["q_len_per_req"] == 1 and last["mask"] is None
        assert not getattr(fn, "note", "")
    else:
        assert last["q_len_per_req"] == q_len
        assert torch.equal(last["mask"], P.xqa_spec_dec_mask(q_len, [q_len, q_len + 1, 70]))
        assert "causal draft mask" in fn.note


def test_adapter_refuses_kv_len_below_q_len(monkeypatch):
    monkeypatch.setattr(P, "_need_cuda", lambda inputs, allow_cpu: None)
    inp = make_decode_inputs([3, 70], q_heads=8, kv_heads=1, head_dim=128, page_size=64, q_len=4, kv_dtype="bf16",
                             device="cpu", seed=5)
    with pytest.raises(P.PeerUnavailable, match="kv_len >= q_len"):
        P.make_flashinfer_xqa(inp)
