"""Decode-attention peers: what a reader would use instead of our split-KV kernels, made runnable offline.

Every peer is ``make_<peer>(inputs, *, out=None) -> fn`` where ``inputs`` is the dict of
``hotpaths.reference.split_kv_decode.make_decode_inputs`` and ``fn()`` (no arguments, CUDA-graph capturable)
writes and returns the bf16 output [batch*q_len, q_heads, head_dim]. Setup work that a serving system does once
per step (gathering, planning, block masks) happens in ``make_*`` and is NOT timed; each peer's docstring says
what that excludes. ``available(name, inputs)`` returns None or a reason string (never raises), and ``make_*``
raises ``PeerUnavailable(reason)``, so a benchmark records the reason in its table instead of failing.

Peers: ``torch_sdpa_gathered``, ``flex_attention_decode`` (PyTorch), ``flashinfer_xqa`` and ``flashinfer_tc``
(FlashInfer 0.7.2: its XQA kernel and its tensor-core decode wrapper), ``hpc_ops_dynamic`` and ``hpc_ops_static``
(HPC-Ops' decode with and without its dynamic task map). The FlashInfer and HPC-Ops bundles are imported by
hotpaths.bench._peers_common (tools/gpu/peers_env.sh sets their folders on the GPU machine).

Precision on the FP8 path: HPC-Ops takes our FP8 Q with its per-token-per-head scales as they are. The others do
not, so Q is dequantized to bf16: ``q_fp8 * q_scale`` for FlashInfer (which reads the fp8 cache itself, k_scale
and v_scale as its own scale arguments) and ``q_fp8 * q_scale * k_scale`` for SDPA/Flex (k_scale folded into Q:
one bf16 rounding of Q, no rounding of K). K/V fp8 e4m3 values are exact in bf16, so SDPA/Flex read K/V as bf16
(twice the fp8 bytes: their GB/s in our tables is *effective*, computed from the fp8 byte count) and multiply the
output by v_scale.
"""

from __future__ import annotations

import math

from hotpaths.bench._peers_common import FLASHINFER_VERSION as FLASHINFER_VERSION  # re-exported for row notes
from hotpaths.bench._peers_common import (
    PeerUnavailable,
    import_flashinfer_072,
    import_hpc_ops,
    make_or_reason,
    run_once,
    short_error,
)

PEER_NAMES = ("torch_sdpa_gathered", "flex_attention_decode", "flashinfer_xqa", "flashinfer_tc", "hpc_ops_dynamic",
              "hpc_ops_static")
HPC_OPS_IMPLS = ("hpc_ops_dynamic", "hpc_ops_static")


def _need_cuda(inputs, allow_cpu: bool) -> None:
    import torch

    if allow_cpu:
        return
    if not torch.cuda.is_available():
        raise PeerUnavailable("not available: needs a CUDA GPU (this machine is CPU-only)")
    if inputs is not None and inputs["q"].device.type != "cuda":
        raise PeerUnavailable(f"not available: inputs are on {inputs['q'].device}, the peer times CUDA tensors")


def _lens(inputs) -> list[int]:
    return [int(v) for v in inputs["kv_lens"].tolist()]


def _dequant_q(inputs, head_dim: int):
    """Q as bf16 with k_scale folded in (fp8 path), so K can stay exact. Shape [batch*q_len, q_heads, head_dim]."""
    import torch

    q = inputs["q"]
    if inputs.get("q_scale") is None:
        return q.to(torch.bfloat16)
    qf = q.float() * inputs["q_scale"].float()[..., None]
    if inputs.get("k_scale") is not None:
        qf = qf * inputs["k_scale"].float()
    return qf.to(torch.bfloat16)


def _v_scale(inputs) -> float:
    return float(inputs["v_scale"].item()) if inputs.get("v_scale") is not None else 1.0


def _gather(cache, block_table, r: int, L: int):
    """Request r's first L tokens as [L, kv_heads, head_dim] bf16 (fp8 -> bf16 is exact)."""
    import torch

    ps = cache.shape[1]
    n = -(-L // ps)
    pages = block_table[r, :n].long()
    return cache[pages].reshape(-1, *cache.shape[2:])[:L].to(torch.bfloat16)


def _dims(inputs) -> tuple[int, int, int, int, int]:
    q, k = inputs["q"], inputs["k_cache"]
    q_len = int(inputs.get("q_len", 1))
    batch = int(inputs["kv_lens"].shape[0])
    return batch, q_len, q.shape[1], k.shape[2], k.shape[3]


def _poisoned_out(inputs, out):
    import torch

    q = inputs["q"]
    if out is None:
        out = torch.full(tuple(q.shape), float("nan"), dtype=torch.bfloat16, device=q.device)
    elif out.dtype != torch.bfloat16 or tuple(out.shape) != tuple(q.shape) or out.device != q.device:
        raise ValueError(f"out: expected bf16 {tuple(q.shape)} on {q.device}, got {out.dtype} "
                         f"{tuple(out.shape)} on {out.device}")
    return out


# ------------------------------------------------------------------------------------------------------------
# torch SDPA over a gathered cache
# ------------------------------------------------------------------------------------------------------------

def make_torch_sdpa_gathered(inputs, *, out=None, allow_cpu: bool = False):
    """PyTorch ``scaled_dot_product_attention`` (GQA via enable_gqa) over K/V gathered to contiguous tensors.

    Fairness choices: the paged cache is gathered per request ONCE here (gather cost NOT timed: a serving system
    with a contiguous cache would not pay it); requests are batched by equal KV length, one SDPA call per distinct
    length (the published cases have 1-3), so there is no padding waste and no mask for q_len 1; MTP (q_len > 1) uses
    a boolean causal mask among the draft tokens. FP8: see the module docstring (K/V read as bf16).
    Shape/Dtype: inputs as make_decode_inputs; returns fn() -> out [batch*q_len, q_heads, head_dim] bf16.
    A query row that sees no key (kv_len < q_len) gets zeros, as in our kernels.
    Raises PeerUnavailable without CUDA (unless allow_cpu, for tests).
    """
    import torch
    import torch.nn.functional as F

    _need_cuda(inputs, allow_cpu)
    batch, q_len, Hq, H, D = _dims(inputs)
    lens = _lens(inputs)
    out = _poisoned_out(inputs, out)
    sm_scale = 1.0 / math.sqrt(D)
    vs = _v_scale(inputs)
    qd = _dequant_q(inputs, D).reshape(batch, q_len, Hq, D)
    dev = qd.device
    groups = []
    for L in sorted(set(lens)):
        idx = [r for r in range(batch) if lens[r] == L]
        it = torch.tensor(idx, dtype=torch.long, device=dev)
        if L == 0:
            groups.append((it, None, None, None, None))
            continue
        k = torch.stack([_gather(inputs["k_cache"], inputs["block_table"], r, L) for r in idx]).transpose(1, 2)
        v = torch.stack([_gather(inputs["v_cache"], inputs["block_table"], r, L) for r in idx]).transpose(1, 2)
        q = qd[it].transpose(1, 2).contiguous()  # [n, Hq, q_len, D]
        mask = None
        if q_len > 1:
            i = torch.arange(q_len, device=dev)[:, None]
            j = torch.arange(L, device=dev)[None, :]
            mask = j < L - (q_len - 1 - i)
        groups.append((it, q, k.contiguous(), v.contiguous(), mask))
    ov = out.view(batch, q_len, Hq, D)
    # rows that see no key (kv_len < q_len): SDPA would give NaN for a fully masked row; the contract says zeros
    dead = torch.tensor([r * q_len + i for r, L in enumerate(lens) if L > 0 for i in range(q_len)
                         if L - (q_len - 1 - i) <= 0], dtype=torch.long, device=dev)

    def fn():
        for it, q, k, v, mask in groups:
            if q is None:
                ov.index_fill_(0, it, 0.0)  # kv_len 0: zero output, as our kernels
                continue
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=sm_scale, enable_gqa=True)
            if vs != 1.0:
                o = (o.float() * vs).to(torch.bfloat16)
            ov.index_copy_(0, it, o.transpose(1, 2))
        if dead.numel():
            out.index_fill_(0, dead, 0.0)
        return out
    return fn


# ------------------------------------------------------------------------------------------------------------
# FlexAttention (decoding path) over a packed, document-masked layout
# ------------------------------------------------------------------------------------------------------------

_flex_compiled = None


def _bucket(n: int, lo: int) -> int:
    """Next power of two >= max(n, lo): few distinct shapes, so few compilations across cases."""
    return 1 << max(int(n) - 1, lo - 1, 0).bit_length()


def _doc_mask_mod(q_doc, kv_doc, kv_off, q_lim):
    def mask_mod(b, h, q_idx, kv_idx):
        return (q_doc[q_idx] == kv_doc[kv_idx]) & (kv_off[kv_idx] < q_lim[q_idx])
    return mask_mod


def make_flex_attention_decode(inputs, *, out=None, allow_cpu: bool = False, compile: bool = True):
    """torch FlexAttention over all requests packed into one KV sequence with a document (+MTP causal) block mask.

    Layout: K/V of every request gathered into one [1, kv_heads, KV, D] bf16 sequence (gather NOT timed, as for
    SDPA), Q rows [1, q_heads, ROWS, D]; ROWS and KV are padded to powers of two (padding is masked out and its
    blocks skipped by the block mask) so the nine cases share few compiled shapes. One flex_attention call,
    compiled once with torch.compile (flex picks its decoding kernel for short Q); the block mask is built once
    here (not timed, like a plan). FP8: see the module docstring.
    Shape/Dtype: inputs as make_decode_inputs; returns fn() -> out [batch*q_len, q_heads, head_dim] bf16.
    Raises PeerUnavailable without CUDA (unless allow_cpu), or when FlexAttention is missing.
    """
    import torch

    _need_cuda(inputs, allow_cpu)
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except Exception as e:  # pragma: no cover - depends on the torch build
        raise PeerUnavailable(f"not available: torch {torch.__version__} has no FlexAttention ({e})") from None
    batch, q_len, Hq, H, D = _dims(inputs)
    lens = _lens(inputs)
    out = _poisoned_out(inputs, out)
    dev = inputs["q"].device
    rows = batch * q_len
    ROWS = _bucket(rows, 16)
    KV = _bucket(sum(lens), 128)
    k = torch.zeros(1, H, KV, D, dtype=torch.bfloat16, device=dev)
    v = torch.zeros(1, H, KV, D, dtype=torch.bfloat16, device=dev)
    kv_doc = torch.full((KV,), -1, dtype=torch.int32, device=dev)
    kv_off = torch.zeros(KV, dtype=torch.int32, device=dev)
    q_doc = torch.full((ROWS,), -2, dtype=torch.int32, device=dev)
    q_lim = torch.zeros(ROWS, dtype=torch.int32, device=dev)
    pos = 0
    for r, L in enumerate(lens):
        if L:
            k[0, :, pos:pos + L] = _gather(inputs["k_cache"], inputs["block_table"], r, L).transpose(0, 1)
            v[0, :, pos:pos + L] = _gather(inputs["v_cache"], inputs["block_table"], r, L).transpose(0, 1)
            kv_doc[pos:pos + L] = r
            kv_off[pos:pos + L] = torch.arange(L, dtype=torch.int32, device=dev)
        q_doc[r * q_len:(r + 1) * q_len] = r
        q_lim[r * q_len:(r + 1) * q_len] = torch.tensor([L - (q_len - 1 - i) for i in range(q_len)],
                                                        dtype=torch.int32, device=dev)
        pos += L
    q = torch.zeros(1, Hq, ROWS, D, dtype=torch.bfloat16, device=dev)
    q[0, :, :rows] = _dequant_q(inputs, D).transpose(0, 1)
    mask_mod = _doc_mask_mod(q_doc, kv_doc, kv_off, q_lim)
    try:
        block_mask = create_block_mask(mask_mod, B=None, H=None, Q_LEN=ROWS, KV_LEN=KV, device=dev)
    except Exception as e:
        raise PeerUnavailable(f"not available: create_block_mask failed: {type(e).__name__}: {e}") from None
    global _flex_compiled
    if compile:
        # one closure per case: dynamo may recompile per case; past its default limit (8) it would silently fall
        # back to the unfused eager flex (and time that), so raise the limit for the 9 cases x 2 dtypes
        import torch._dynamo

        for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                     "accumulated_recompile_limit"):  # not `k`: that is the key tensor
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 64))
        if _flex_compiled is None:
            _flex_compiled = torch.compile(flex_attention, dynamic=False)
        attn = _flex_compiled
    else:  # CPU correctness checks ask for the unfused eager flex on purpose: its "use torch.compile" advice is noise
        def attn(*a, **kw):
            import warnings

            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="flex_attention called without torch.compile",
                                        category=UserWarning)
                return flex_attention(*a, **kw)
    sm_scale = 1.0 / math.sqrt(D)
    vs = _v_scale(inputs)
    empty = torch.tensor([r * q_len + i for r, L in enumerate(lens) if L == 0 for i in range(q_len)],
                         dtype=torch.long, device=dev)
    # Compile (and fail) here, outside any timing or graph capture. On the H200 image (torch 2.11) Inductor found no
    # valid configuration for flex's short-query decoding template (NoValidChoicesError); the general flex kernel
    # (kernel_options FORCE_USE_FLEX_ATTENTION) is then tried, and the row's note says which one ran.
    opts, errors = None, []
    for cand in (None, {"FORCE_USE_FLEX_ATTENTION": True}):
        try:
            attn(q, k, v, block_mask=block_mask, scale=sm_scale, enable_gqa=True,
                 **({"kernel_options": cand} if cand else {}))
            opts = cand
            break
        except Exception as e:
            errors.append(f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
    else:
        raise PeerUnavailable("not available: flex_attention failed: " + " | then with FORCE_USE_FLEX_ATTENTION: "
                              .join(errors)) from None
    kw = {"kernel_options": opts} if opts else {}
    variant_note = "general flex kernel (FORCE_USE_FLEX_ATTENTION; the decoding template failed)" if opts else \
        "flex decoding template"

    def fn():
        o = attn(q, k, v, block_mask=block_mask, scale=sm_scale, enable_gqa=True, **kw)  # [1, Hq, ROWS, D]
        o = o[0, :, :rows].transpose(0, 1)
        if vs != 1.0:
            o = (o.float() * vs).to(torch.bfloat16)
        out.copy_(o)
        if empty.numel():
            out.index_fill_(0, empty, 0.0)  # kv_len 0: zero output, as our kernels
        return out
    fn.note = variant_note
    return fn


# ------------------------------------------------------------------------------------------------------------
# shared by the peers that read our paged cache in place
# ------------------------------------------------------------------------------------------------------------

def clean_cache_copy(inputs):
    """Copies of k_cache and v_cache whose every slot that holds no token is zero (our generator poisons them
    with NaN; HPC-Ops and FlashInfer's XQA read whole pages and want the tail of a request's last page zeroed).
    Made once per case, outside timing. Shape/Dtype: as inputs' k_cache / v_cache ([pages, page_size, kv_heads,
    head_dim], fp8 e4m3 or bf16). Raises nothing for well-formed inputs."""
    import torch

    kc, vc, bt = inputs["k_cache"], inputs["v_cache"], inputs["block_table"]
    ps = kc.shape[1]
    valid = torch.zeros(kc.shape[0], ps, dtype=torch.bool, device=kc.device)
    for r, L in enumerate(_lens(inputs)):
        n = -(-L // ps)
        if n:
            valid[bt[r, :n].long()] = (torch.arange(n * ps, device=kc.device) < L).view(n, ps)

    def clean(c):
        raw = c.view(torch.uint8) if c.element_size() == 1 else c.view(torch.int16)  # bit copy, any dtype
        keep = valid[:, :, None, None].expand(raw.shape)
        return torch.where(keep, raw, torch.zeros((), dtype=raw.dtype, device=raw.device)).view(c.dtype)
    return clean(kc), clean(vc)


def _bf16_q_without_k_scale(inputs):
    """Q as bf16: q_fp8 * q_scale on the FP8 path (k_scale goes into the peer's own scale argument), else Q."""
    import torch

    q = inputs["q"]
    if inputs.get("q_scale") is None:
        return q.to(torch.bfloat16).contiguous()
    return (q.float() * inputs["q_scale"].float()[..., None]).to(torch.bfloat16).contiguous()


def _first_call(call, out, what: str):
    """Run a peer once (JIT builds and plan-time checks happen here, outside timing), then re-poison ``out`` so the
    caller's first fn() is the correctness check. Raises PeerUnavailable with the peer's error."""
    run_once(call, what)
    out.fill_(float("nan"))


# ------------------------------------------------------------------------------------------------------------
# FlashInfer 0.7.2: XQA (what vLLM runs for Hopper decode) and the tensor-core decode wrapper
# ------------------------------------------------------------------------------------------------------------

def xqa_spec_dec_mask(q_len: int, kv_lens, *, device=None):
    """The draft-block mask FlashInfer 0.7.2's XQA kernel needs at q_len > 1 (its ``mask`` argument), built so it
    sees what our decode sees: draft token i of a request attends to kv_len - (q_len - 1 - i) tokens.

    What the kernel reads (flashinfer/xqa.py docstring and data/csrc/xqa/mha.cu applyMaskFromInput, mha_sm90.cu
    SpecDec::loadTileMaskRow): the last q_len cache positions of each request are its draft tokens; every earlier
    position is visible to every draft row; row i may see draft j iff bit j of row i is set, where a row is
    ceil(q_len/32) little-endian 32-bit words stored as pairs of uint16 (bit j is bit j % 16 of uint16 j // 16).
    So causal drafts set bits 0..i of row i; the mask does not depend on kv_len, but kv_len must be >= q_len (the
    kernel assumes the drafts are in the cache: the SM90 kernel asserts it) and is checked here.
    Shape/Dtype: kv_lens [batch] ints (a sequence or a tensor; the q_len new tokens included); returns
    uint16 [batch, q_len, 2 * ceil(q_len / 32)], contiguous, on ``device`` (default CPU).
    Raises ValueError when q_len < 2 (no mask at q_len 1), kv_lens is empty, or a kv_len < q_len.
    """
    import torch

    if isinstance(q_len, bool) or not isinstance(q_len, int) or q_len < 2:
        raise ValueError(f"q_len: expected an int >= 2 (XQA takes no mask at q_len 1), got {q_len!r}")
    lens = [int(v) for v in (kv_lens.tolist() if isinstance(kv_lens, torch.Tensor) else kv_lens)]
    if not lens:
        raise ValueError("kv_lens: expected at least one request, got none")
    short = [(r, L) for r, L in enumerate(lens) if L < q_len]
    if short:
        raise ValueError(f"kv_lens: XQA's speculative decoding needs every kv_len >= q_len = {q_len} (the drafts "
                         f"are the last q_len cache positions); request {short[0][0]} has {short[0][1]}")
    words = -(-q_len // 32)
    # byte k of row i holds drafts 8k..8k+7; bytes in little-endian order make the uint16 pairs (and the uint32
    # words the kernel loads) directly
    draft = torch.arange(words * 32, dtype=torch.int64).view(words * 4, 8)  # [bytes, 8 bits]
    row = torch.arange(q_len, dtype=torch.int64).view(q_len, 1, 1)
    weight = torch.tensor([1 << b for b in range(8)], dtype=torch.int64)
    row_bytes = ((draft[None] <= row).to(torch.int64) * weight).sum(-1).to(torch.uint8)  # [q_len, 4*words]
    mask = row_bytes.view(torch.uint16)  # [q_len, 2*words]
    return mask[None].expand(len(lens), q_len, 2 * words).contiguous().to(device or "cpu")


def xqa_mask_visibility(mask, q_len: int, kv_lens):
    """Which keys each draft row sees under XQA's reading of ``mask`` (the rule quoted in xqa_spec_dec_mask),
    decoded bit by bit, independently of how the mask was built: for tests and failure messages.
    Shape/Dtype: mask uint16 [batch, q_len, 2 * ceil(q_len / 32)]; kv_lens [batch] ints; returns bool
    [batch, q_len, max(kv_lens)] (True: row i of request r attends to key position p).
    Raises ValueError when the mask's shape does not fit q_len and kv_lens.
    """
    import torch

    lens = [int(v) for v in (kv_lens.tolist() if isinstance(kv_lens, torch.Tensor) else kv_lens)]
    words16 = 2 * -(-q_len // 32)
    if tuple(mask.shape) != (len(lens), q_len, words16) or mask.dtype != torch.uint16:
        raise ValueError(f"mask: expected uint16 {(len(lens), q_len, words16)}, got {mask.dtype} "
                         f"{tuple(mask.shape)}")
    vals = mask.cpu().contiguous().view(torch.int16).to(torch.int64) & 0xFFFF  # the uint16 values as integers
    vis = torch.zeros(len(lens), q_len, max(lens), dtype=torch.bool)
    for r, L in enumerate(lens):
        first_draft = L - q_len
        for i in range(q_len):
            for p in range(L):
                if p < first_draft:
                    vis[r, i, p] = True
                else:
                    j = p - first_draft
                    vis[r, i, p] = bool((int(vals[r, i, j // 16]) >> (j % 16)) & 1)
    return vis


def make_flashinfer_xqa(inputs, *, out=None):
    """FlashInfer 0.7.2 ``flashinfer.decode.trtllm_batch_decode_with_kv_cache(..., kv_layout="NHD",
    backend="xqa")`` on our paged cache (block table and lengths as they are; no plan).

    Q is bf16 (q_fp8 * q_scale on the FP8 path); bmm1_scale = k_scale / sqrt(head_dim), bmm2_scale = v_scale (1
    for BF16). It reads a clean copy of the cache (clean_cache_copy, made here, not timed) and a zeroed 128 MB
    workspace. q_len > 1 (MTP) passes q_len_per_req=q_len and the causal draft mask of xqa_spec_dec_mask (built
    here once per case on the device, not timed); Q and out stay [batch*q_len, ...] (request r owns rows
    r*q_len .. r*q_len + q_len - 1, as FlashInfer wants). The first call (its JIT build, ~8 s) is here.
    Shape/Dtype: inputs as make_decode_inputs; returns fn() -> out [batch*q_len, q_heads, head_dim] bf16.
    Raises PeerUnavailable without CUDA, without the FlashInfer 0.7.2 bundle, for kv_len 0 (or kv_len < q_len
    at q_len > 1), or when the first call fails (its error is the reason).
    """
    import torch

    _need_cuda(inputs, False)
    batch, q_len, Hq, H, D = _dims(inputs)
    lens = _lens(inputs)
    if any(L == 0 for L in lens):
        raise PeerUnavailable("not available: FlashInfer's paged decode needs every kv_len >= 1")
    if q_len > 1 and any(L < q_len for L in lens):
        raise PeerUnavailable(f"not available: XQA's speculative decoding needs every kv_len >= q_len ({q_len}): "
                              "its draft tokens are the last q_len cache positions")
    fi = import_flashinfer_072()
    try:
        from flashinfer.decode import trtllm_batch_decode_with_kv_cache as xqa  # type: ignore
    except Exception as e:
        raise PeerUnavailable(f"not available: flashinfer {fi.__version__} has no "
                              f"decode.trtllm_batch_decode_with_kv_cache ({short_error(e)})") from None
    out = _poisoned_out(inputs, out)
    kc, vc = clean_cache_copy(inputs)
    fp8 = kc.dtype == torch.float8_e4m3fn
    q = _bf16_q_without_k_scale(inputs)
    ks = float(inputs["k_scale"].item()) if fp8 else 1.0
    bmm1, bmm2 = ks / math.sqrt(D), (_v_scale(inputs) if fp8 else 1.0)
    bt = inputs["block_table"].to(torch.int32).contiguous()
    seq = inputs["kv_lens"].to(torch.int32).contiguous()
    ws = torch.zeros(128 << 20, dtype=torch.uint8, device=kc.device)  # zeroed: XQA keeps semaphores in it
    kw = dict(bmm1_scale=bmm1, bmm2_scale=bmm2, out=out, kv_layout="NHD", backend="xqa")
    mask = None
    if q_len > 1:
        mask = xqa_spec_dec_mask(q_len, lens, device=kc.device)
        kw.update(q_len_per_req=q_len, mask=mask)

    def call():
        return xqa(q, (kc, vc), ws, bt, seq, max(lens), **kw)
    _first_call(call, out, "flashinfer trtllm_batch_decode_with_kv_cache(backend='xqa'"
                + (f", q_len_per_req={q_len}, causal draft mask)" if q_len > 1 else ")"))

    def fn():
        call()
        return out
    fn.keep = (ws, kc, vc, mask)  # the workspace, the clean cache and the mask live as long as the closure
    if q_len > 1:
        fn.note = f"q_len_per_req={q_len} with a causal draft mask (uint16 [batch, q_len, 2]), built once, not timed"
    return fn


def make_flashinfer_tc(inputs, *, out=None):
    """FlashInfer 0.7.2 ``BatchDecodeWithPagedKVCacheWrapper`` (NHD, use_tensor_cores=True, CUDA-graph mode) on our
    paged cache in place (indices / indptr / last_page_len from the block table, so it never reads a poisoned
    slot). ``plan()`` runs here (not timed, like our plan); fn() is ``run()`` only. Q bf16 (q_fp8 * q_scale on
    the FP8 path), k_scale / v_scale as its float arguments. The first call JIT-builds (~21 s).
    Shape/Dtype: inputs as make_decode_inputs; returns fn() -> out [batch, q_heads, head_dim] bf16.
    Raises PeerUnavailable without CUDA or the bundle, for q_len > 1 (a decode wrapper) or kv_len 0, or when
    plan/run fails.
    """
    import torch

    _need_cuda(inputs, False)
    batch, q_len, Hq, H, D = _dims(inputs)
    lens = _lens(inputs)
    if q_len != 1:
        raise PeerUnavailable("not available: FlashInfer's decode wrapper takes one query token per request "
                              "(q_len 1)")
    if any(L == 0 for L in lens):
        raise PeerUnavailable("not available: FlashInfer's paged decode needs every kv_len >= 1")
    fi = import_flashinfer_072()
    out = _poisoned_out(inputs, out)
    kc, vc, bt = inputs["k_cache"], inputs["v_cache"], inputs["block_table"]
    dev = kc.device
    ps = kc.shape[1]
    npages = [-(-L // ps) for L in lens]
    indptr = torch.tensor([0] + list(_cumsum(npages)), dtype=torch.int32, device=dev)
    indices = torch.cat([bt[r, :n] for r, n in enumerate(npages)]).to(torch.int32).contiguous()
    last = torch.tensor([L - (n - 1) * ps for L, n in zip(lens, npages)], dtype=torch.int32, device=dev)
    fp8 = kc.dtype == torch.float8_e4m3fn
    q = _bf16_q_without_k_scale(inputs)
    k_scale = float(inputs["k_scale"].item()) if fp8 else None
    v_scale = float(inputs["v_scale"].item()) if fp8 else None
    ws = torch.zeros(128 << 20, dtype=torch.uint8, device=dev)
    holder = {}

    def setup_and_call():
        w = fi.BatchDecodeWithPagedKVCacheWrapper(
            ws, "NHD", use_cuda_graph=True, use_tensor_cores=True,
            paged_kv_indptr_buffer=torch.empty_like(indptr), paged_kv_indices_buffer=torch.empty_like(indices),
            paged_kv_last_page_len_buffer=torch.empty_like(last))
        w.plan(indptr, indices, last, Hq, H, D, ps, q_data_type=torch.bfloat16, kv_data_type=kc.dtype)
        holder["w"] = w
        w.run(q, (kc, vc), k_scale=k_scale, v_scale=v_scale, out=out)
    _first_call(setup_and_call, out, "FlashInfer BatchDecodeWithPagedKVCacheWrapper plan/run")
    w = holder["w"]

    def fn():
        w.run(q, (kc, vc), k_scale=k_scale, v_scale=v_scale, out=out)
        return out
    fn.keep = (w, ws)
    return fn


# ------------------------------------------------------------------------------------------------------------
# HPC-Ops (the production library these designs come from), measured in the same process
# ------------------------------------------------------------------------------------------------------------

HPC_OPS_MIN_PROCESS_LEN = 64  # what HPC-Ops' own decode benchmark passes


def _make_hpc_ops(inputs, *, out=None, dynamic: bool):
    import torch

    _need_cuda(inputs, False)
    batch, q_len, Hq, H, D = _dims(inputs)
    lens = _lens(inputs)
    kc0 = inputs["k_cache"]
    fp8 = kc0.dtype == torch.float8_e4m3fn
    if Hq % H or Hq // H not in (4, 8):
        raise PeerUnavailable(f"not available: HPC-Ops decode runs 4 or 8 query heads per KV head, got {Hq}/{H}")
    if fp8 and kc0.shape[1] != 64:
        raise PeerUnavailable(f"not available: HPC-Ops FP8 decode needs page size 64, got {kc0.shape[1]}")
    if any(L < q_len for L in lens):
        raise PeerUnavailable("not available: HPC-Ops decode needs every kv_len >= q_len (the new tokens are in "
                              "the cache)")
    hpc = import_hpc_ops()
    out = _poisoned_out(inputs, out)
    kc, vc = clean_cache_copy(inputs)
    bt = inputs["block_table"].to(torch.int32).contiguous()
    kv_lens = inputs["kv_lens"].to(torch.int32).contiguous()
    q = inputs["q"].contiguous()
    tm = None
    if dynamic:
        try:  # the task map is built once per step (like our assign): not timed
            tm = hpc.get_attention_decode_task_workspace(batch, max(lens), H,
                                                         min_process_len=HPC_OPS_MIN_PROCESS_LEN)
            # its argument named `mtp` takes the number of query tokens per request (q_len), not q_len - 1
            hpc.assign_attention_decode_task(kv_lens, tm, H, q_len, True, min_process_len=HPC_OPS_MIN_PROCESS_LEN)
        except Exception as e:
            raise PeerUnavailable(f"not available: hpc.assign_attention_decode_task failed: {short_error(e)}") \
                from None
    if fp8:
        qs = inputs["q_scale"].float().contiguous()
        ks, vs = inputs["k_scale"].float().reshape(1), inputs["v_scale"].float().reshape(1)
        name = "attention_decode_fp8"

        def call():
            return hpc.attention_decode_fp8(q, kc, vc, bt, kv_lens, qs, ks, vs, mtp=q_len - 1, new_kv_included=True,
                                            splitk=True, task_map=tm, output=out)
    else:
        name = "attention_decode_bf16"

        def call():
            return hpc.attention_decode_bf16(q, kc, vc, bt, kv_lens, mtp=q_len - 1, new_kv_included=True,
                                             splitk=True, task_map=tm, output=out)
    _first_call(call, out, f"hpc.{name}")

    def fn():
        call()
        return out
    fn.keep = (kc, vc, tm)
    fn.note = (f"hpc.{name}, " + (f"task map from assign_attention_decode_task(min_process_len="
                                   f"{HPC_OPS_MIN_PROCESS_LEN}), not timed" if dynamic else "task_map None (static "
                                                                                           "split-K)"))
    return fn


def make_hpc_ops_dynamic(inputs, *, out=None):
    """HPC-Ops ``hpc.attention_decode_fp8`` / ``attention_decode_bf16`` with its dynamic task map
    (``get_attention_decode_task_workspace`` + ``assign_attention_decode_task(min_process_len=64)``, built here
    once per step like our plan: not timed). Q as ours (FP8 with per-token-per-head scales, or BF16); a clean copy
    of the cache (clean_cache_copy); mtp = q_len - 1, new_kv_included=True.
    Shape/Dtype: inputs as make_decode_inputs; returns fn() -> out [batch*q_len, q_heads, head_dim] bf16.
    Raises PeerUnavailable without CUDA or the HPC-Ops bundle, for a GQA ratio other than 4 or 8, FP8 with a page
    other than 64, kv_len < q_len, or when its first call fails (the error is the reason).
    """
    return _make_hpc_ops(inputs, out=out, dynamic=True)


def make_hpc_ops_static(inputs, *, out=None):
    """HPC-Ops' decode with task_map=None (its static split-K); otherwise as make_hpc_ops_dynamic (same
    Shape/Dtype and errors)."""
    return _make_hpc_ops(inputs, out=out, dynamic=False)

def _cumsum(xs):
    s = 0
    for x in xs:
        s += x
        yield s


# ------------------------------------------------------------------------------------------------------------

MAKERS = {"torch_sdpa_gathered": make_torch_sdpa_gathered,
          "flex_attention_decode": make_flex_attention_decode,
          "flashinfer_xqa": make_flashinfer_xqa,
          "flashinfer_tc": make_flashinfer_tc,
          "hpc_ops_dynamic": make_hpc_ops_dynamic,
          "hpc_ops_static": make_hpc_ops_static}


def available(name: str, inputs=None) -> str | None:
    """None when peer ``name`` can be set up here, else the reason (a string; never raises).

    Cheap checks only (CUDA present, source present, importable); make_<peer> may still raise PeerUnavailable
    for a particular input (e.g. a JIT build failure), which try_make turns into a reason.
    """
    if name not in MAKERS:
        return f"not available: unknown peer {name!r}; known: {', '.join(PEER_NAMES)}"
    try:
        _need_cuda(inputs, False)
        if name.startswith("flashinfer"):
            import_flashinfer_072()
        elif name.startswith("hpc_ops"):
            import_hpc_ops()
        elif name == "flex_attention_decode":
            import torch.nn.attention.flex_attention  # noqa: F401
    except PeerUnavailable as e:
        return str(e)
    except Exception as e:
        return f"not available: {type(e).__name__}: {e}"
    return None


def try_make(name: str, inputs, **kw):
    """(fn, None) or (None, reason): never raises, so one failing peer becomes a table row, not a crash."""
    reason = available(name, inputs)
    if reason is not None:
        return None, reason
    return make_or_reason(MAKERS, name, inputs, **kw)
