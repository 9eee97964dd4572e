"""Benchmark of the fused attention prologue: the table rows (notebook 03 and the CLI), the chain into decode
attention, and the ``hotpaths prologue`` subcommand.

Tables:
- ``prologue_rows``: one row per (head configuration, token count, impl): median/p10/p90 us (CUDA-graph replay, L2
  flushed before each replay; ``torch_unfused`` eager), bytes (read QKV once, write Q + scales and the cache once),
  the read probe of the same bytes and our fraction of it, the one-kernel timing floor, the dependent-load floor
  (``dependent_load_floor``: one kernel reading the positions, then the cos/sin rows they address), the error of Q
  (dequantized:
  rel_l2_err, max_abs_err...) and K (from the cache: k_rel_l2_err) vs the exact fp64 reference on the first 256
  tokens, for every impl (the columns to compare impls by), and with ``check`` q_mismatch / cache_mismatch: bytes
  that differ from OUR same-precision emulation on the first 1024 tokens (0 for our kernel by design; a peer that
  rounds differently (division instead of a reciprocal, another eps, FMA) shows thousands, which says nothing
  about its accuracy: its rows say so in the note). Without an SM90 GPU, ``fused`` and the
  torch impls run their CPU emulation (impl ``*_emulation``, untimed) and the GPU-only peers give their reason.
- ``chain_rows``: prologue + split-KV decode attention in one CUDA graph with the prologue's PDL trigger right after its
  wait (``chain_pdl``) and without it (``chain_no_trigger``: the decode kernel launches only when the prologue has
  finished, as without PDL), against each alone and their sum; both with the decode plan's early work off (the old
  launches). ``chain_pdl_early``: as chain_pdl with the plan's early work on (the attention kernel prefetches its
  start-up arrays into L2 before its PDL wait). The step's assign kernel (plan.update) in the chain:
  ``decode_assign`` (update + run alone, early off), ``chain_assign_pdl`` (prologue, update, run; early off: assign
  a plain launch) and ``chain_assign_pdl_early`` (early on: assign overlaps the prologue), their ``saved_us`` against
  prologue + decode_assign.

Token layouts (``make_bench_inputs``): decode = one token per request (MTP shapes: ``q_len`` tokens per request)
at the end of a KV sequence of 64-511 tokens; prefill = one request of ``tokens`` tokens from position 0. Our
kernel gets positions and slots; the peers get the same tokens as sequence lengths, a Q prefix sum and a block
table (``layout``).
"""

from __future__ import annotations

import torch

from hotpaths.reference import attention_prologue as ref

OP = "attention_prologue"
IMPLS = ("fused", "hpc_ops", "flashinfer_fused", "torch_unfused", "torch_unfused_graph")
# Kernel variants for A/B rows: impl "fused_<variant>" runs our kernel with attention_prologue(variant=...) (the
# names are hotpaths.kernels.attention_prologue.VARIANTS); "fused" runs the default variant.
VARIANT_PREFIX = "fused_"
DECODE_MAX = 256
ERR_TOKENS = 256     # tokens compared with the exact reference (per-token op: a prefix is a fair sample)
CHECK_TOKENS = 1024  # tokens compared bit for bit with the emulation under check=True
EXTRA_COLUMNS = ["tokens", "mode", "q_heads", "kv_heads", "head_dim", "read_probe_us", "pct_of_read_probe",
                 "floor_us", "over_floor_us", "dep_floor_us", "over_dep_floor_us", "k_rel_l2_err", "q_mismatch",
                 "cache_mismatch", "timing", "note"]


def case_name(q_heads: int, kv_heads: int, mode: str, tokens: int) -> str:
    """``8q1kv-decode-64``: the head configuration, mode and token count of a row."""
    return f"{q_heads}q{kv_heads}kv-{mode}-{tokens}"


def mode_of(tokens: int, mode: str = "auto") -> str:
    """'decode' for tokens <= DECODE_MAX under mode 'auto', else 'prefill'; an explicit mode is returned as is.
    Raises ValueError for another mode."""
    if mode not in ("auto", "decode", "prefill"):
        raise ValueError(f"mode: expected 'auto', 'decode' or 'prefill', got {mode!r}")
    return ("decode" if tokens <= DECODE_MAX else "prefill") if mode == "auto" else mode


def request_layout(tokens: int, mode: str, page_size: int, *, q_len: int = 1, seed: int = 0) -> dict:
    """The tokens of a step as requests: positions [T] int64, slot_mapping [T] int64, and the peers' metadata
    (seq_lens [R] int32 after the append, q_indptr [R+1] int32, block_table [R, max_pages] int32 over shuffled
    pages, is_prefill, max_seqlen, num_pages).
    decode: R = T / q_len requests (T must be a multiple of q_len), request r of KV length 64 + (37 r mod 448)
    (>= q_len) whose last q_len tokens are new; prefill: one request of T tokens from position 0.
    Raises ValueError for T not a multiple of q_len or a bad mode.
    """
    if mode == "prefill":
        lens, nnew = [tokens], [tokens]
    elif mode == "decode":
        if q_len < 1 or tokens % q_len:
            raise ValueError(f"tokens {tokens}: expected a multiple of q_len {q_len} in decode mode")
        R = tokens // q_len
        lens = [max(q_len, 64 + (37 * r) % 448) for r in range(R)]
        nnew = [q_len] * R
    else:
        raise ValueError(f"mode: expected 'decode' or 'prefill', got {mode!r}")
    g = torch.Generator().manual_seed(seed + 1)
    pages = [-(-L // page_size) for L in lens]
    num_pages = sum(pages) + 1
    perm = torch.randperm(num_pages, generator=g)
    maxp = max(pages, default=0) or 1
    bt = torch.zeros(len(lens), maxp, dtype=torch.int32)
    pos_l, slot_l, o = [], [], 0
    for r, (L, n, npg) in enumerate(zip(lens, nnew, pages)):
        bt[r, :npg] = perm[o:o + npg].to(torch.int32)
        o += npg
        for p in range(L - n, L):
            pos_l.append(p)
            slot_l.append(int(bt[r, p // page_size]) * page_size + p % page_size)
    qi = [0]
    for n in nnew:
        qi.append(qi[-1] + n)
    return dict(positions=torch.tensor(pos_l, dtype=torch.int64), slot_mapping=torch.tensor(slot_l, dtype=torch.int64),
                seq_lens=torch.tensor(lens, dtype=torch.int32), q_indptr=torch.tensor(qi, dtype=torch.int32),
                block_table=bt, is_prefill=mode == "prefill", max_seqlen=max(lens, default=0), num_pages=num_pages)


def make_bench_inputs(tokens: int, *, mode: str = "auto", q_heads: int = 8, kv_heads: int = 1, head_dim: int = 128,
                      page_size: int = 64, norm_order: str = "norm_rope", rope: str = "neox",
                      kv_dtype: str = "fp8", q_dtype: str = "fp8", rotary_dim: int | None = None,
                      eps: float = ref.DEFAULT_EPS, q_len: int = 1, device="cpu", seed: int = 0) -> dict:
    """make_prologue_inputs with positions and slots from request_layout (the key ``layout`` holds it).
    Raises ValueError (bad configuration) or ResourceError (does not fit in memory) before allocating."""
    from hotpaths.reference.common import check_fits

    mode = mode_of(tokens, mode)
    H = q_heads + 2 * kv_heads
    kvb = 1 if kv_dtype == "fp8" else 2
    # before the request layout, whose size grows with the tokens too: the cache holds at least the tokens' slots
    need = tokens * H * head_dim * 2 * 3 + 2 * (tokens + page_size) * kv_heads * head_dim * kvb
    check_fits(f"prologue {case_name(q_heads, kv_heads, mode, tokens)}", host_bytes=need * 3, device_bytes=need,
               device=device)
    lay = request_layout(tokens, mode, page_size, q_len=q_len, seed=seed)
    max_pos = max(lay["max_seqlen"], 1)
    inp = ref.make_prologue_inputs(tokens, q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim,
                                   page_size=page_size, rotary_dim=rotary_dim, kv_dtype=kv_dtype, q_dtype=q_dtype,
                                   norm_order=norm_order, rope=rope, eps=eps, max_pos=max_pos,
                                   extra_pages=lay["num_pages"] - (-(-tokens // page_size)), device="cpu", seed=seed)
    inp["positions"], inp["slot_mapping"] = lay["positions"], lay["slot_mapping"]
    dev = torch.device(device)
    out = {k: (v.to(dev).contiguous() if isinstance(v, torch.Tensor) else v) for k, v in inp.items()}
    out["layout"] = {k: (v.to(dev) if isinstance(v, torch.Tensor) else v) for k, v in lay.items()}
    out["mode"] = mode
    return out


OP_ARGS = ("qkv", "q_norm_weight", "k_norm_weight", "cos_sin", "positions", "slot_mapping", "k_cache", "v_cache")
OP_KW = ("eps", "norm_order", "rope", "rotary_dim", "q_dtype", "k_scale", "v_scale")


def op_args(inputs: dict) -> tuple[tuple, dict]:
    """(positional, keyword) arguments of the op from a make_*_inputs dict."""
    return tuple(inputs[k] for k in OP_ARGS), {k: inputs[k] for k in OP_KW}


def fused_variants() -> tuple[str, ...]:
    """The kernel's variant names (hotpaths.kernels.attention_prologue.VARIANTS)."""
    from hotpaths.kernels.attention_prologue import VARIANTS

    return VARIANTS


def variant_of(impl: str) -> str | None:
    """The kernel variant an impl name runs ("fused" -> the default, "fused_pair" -> "pair"), None for a peer."""
    if impl == "fused":
        from hotpaths.kernels.attention_prologue import DEFAULT_VARIANT

        return DEFAULT_VARIANT
    if impl.startswith(VARIANT_PREFIX) and impl[len(VARIANT_PREFIX):] in fused_variants():
        return impl[len(VARIANT_PREFIX):]
    return None


def make_fused(inputs, *, pdl: bool = True, trigger: bool = True, variant: str | None = None):
    """Our kernel with preallocated outputs: fn() -> (q, q_scale, k_cache, v_cache); capturable. pdl / trigger /
    variant (None: the default): as attention_prologue()."""
    from hotpaths.kernels.attention_prologue import attention_prologue

    a, kw = op_args(inputs)
    T, D = inputs["qkv"].shape[0], inputs["k_cache"].shape[3]
    Hq = inputs["qkv"].shape[1] // D - 2 * inputs["k_cache"].shape[2]
    dev = inputs["qkv"].device
    fp8q = inputs["q_dtype"] == "fp8"
    q_out = torch.empty((T, Hq, D), dtype=ref.FP8_DTYPE if fp8q else torch.bfloat16, device=dev)
    qs_out = torch.empty((T, Hq), dtype=torch.float32, device=dev) if fp8q else None
    if variant is not None:
        kw = dict(kw, variant=variant)
    attention_prologue(*a, **kw, q_out=q_out, q_scale_out=qs_out, pdl=pdl, trigger=trigger)  # validates

    def fn():
        attention_prologue(*a, **kw, q_out=q_out, q_scale_out=qs_out, pdl=pdl, trigger=trigger, check_inputs=False)
        return q_out, qs_out, inputs["k_cache"], inputs["v_cache"]
    return fn


def _dequant(q, qs):
    q = q.detach().cpu().double()
    return q if qs is None else q * qs.detach().cpu().double()[..., None]


def _errors(out, inputs, n: int) -> dict:
    """Q (dequantized) and K (read back from the cache) vs the exact reference on the first n tokens."""
    from hotpaths.harness.check import check

    q, qs, kc, vc = out
    T = inputs["qkv"].shape[0]
    n = min(n, T)
    if n == 0:
        return {}
    Hk, D = kc.shape[2], kc.shape[3]
    qr, kr, _vr = ref.attention_prologue_ref(inputs["qkv"][:n].cpu(), inputs["q_norm_weight"].cpu(),
                                             inputs["k_norm_weight"].cpu(), inputs["cos_sin"].cpu(),
                                             inputs["positions"][:n].cpu(), kv_heads=Hk, eps=inputs["eps"],
                                             norm_order=inputs["norm_order"], rope=inputs["rope"],
                                             rotary_dim=inputs["rotary_dim"])
    qd = _dequant(q[:n], None if qs is None else qs[:n])
    res = check(qd, qr)
    sm = inputs["slot_mapping"][:n].cpu()
    keep = sm >= 0
    kd = kc.detach().cpu().view(-1, Hk, D)[sm[keep]].double()
    if inputs.get("k_scale") is not None:
        kd = kd * float(inputs["k_scale"])
    kref = kr[keep]
    k_err = float((kd - kref).norm() / kref.norm().clamp_min(1e-300)) if kref.numel() else None
    return {**res.as_row(), "k_rel_l2_err": k_err}


def _mismatch(out, inputs, n: int, memo: dict | None = None) -> dict:
    """Bytes of Q, q_scale and the written cache rows that differ from the emulation on the first n tokens (memo:
    a dict keeping the emulation between impls of one input set)."""
    q, qs, kc, vc = out
    n = min(n, inputs["qkv"].shape[0])
    sub = dict(inputs)
    for k in ("qkv", "positions", "slot_mapping"):
        sub[k] = inputs[k][:n]
    memo = {} if memo is None else memo
    if n not in memo:
        a, kw = op_args({k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in sub.items()})
        memo[n] = ref.attention_prologue_emulation(*a, **kw)
    eq, eqs, ekc, evc = memo[n]
    qb = q[:n].detach().cpu().contiguous().view(torch.uint8)
    qm = int((qb != eq.contiguous().view(torch.uint8)).sum())
    if eqs is not None and qs is not None:
        qm += int((qs[:n].detach().cpu() != eqs).sum())
    Hk, D = kc.shape[2], kc.shape[3]
    sm = sub["slot_mapping"].cpu()
    s = sm[sm >= 0]
    cm = 0
    for got, exp in ((kc, ekc), (vc, evc)):
        g = got.detach().cpu().contiguous().view(-1, Hk, D)[s].view(torch.uint8)
        e = exp.contiguous().view(-1, Hk, D)[s].view(torch.uint8)
        cm += int((g != e).sum())
    return {"q_mismatch": qm, "cache_mismatch": cm}


def dependent_load_floor(inputs: dict, *, iters: int = 100):
    """The timing floor of a kernel whose loads depend on loaded values, as the prologue's do (the cos/sin rows are
    addressed by the positions): ``torch.index_select(cos_sin, 0, positions)``, one kernel, timed by the same bench
    (graph replay, L2 flushed, median). At decode sizes its bytes are a few KB, so it measures two dependent DRAM
    round trips plus one kernel's fixed cost, below which no prologue can run. Returns a harness Timing, or None
    without a CUDA device."""
    from hotpaths.harness import bench as hb

    if not torch.cuda.is_available():
        return None
    cs, pos = inputs["cos_sin"], inputs["positions"].long()
    out = torch.empty(pos.numel(), *cs.shape[1:], dtype=cs.dtype, device=cs.device)
    return hb.bench(lambda: torch.index_select(cs, 0, pos, out=out), iters=iters)


def _repro(t: int, a: dict, impl: str) -> str:
    return (f"hotpaths prologue --tokens {t} --q-heads {a['q_heads']} --kv-heads {a['kv_heads']} --head-dim "
            f"{a['head_dim']} --page-size {a['page_size']} --norm-order {a['norm_order']} --rope {a['rope']} "
            f"--kv-dtype {a['kv_dtype']} --q-dtype {a['q_dtype']} --impl {impl}")


def prologue_rows(tokens_list, *, q_heads: int = 8, kv_heads: int = 1, head_dim: int = 128, page_size: int = 64,
                  norm_order: str = "norm_rope", rope: str = "neox", kv_dtype: str = "fp8", q_dtype: str = "fp8",
                  rotary_dim: int | None = None, eps: float = ref.DEFAULT_EPS, impls=IMPLS, mode: str = "auto",
                  check: bool = False, iters: int = 100, seed: int = 0) -> list[dict]:
    """The attention_prologue table: one row per (tokens, impl); see the module docstring for the columns. impls:
    names of IMPLS, or ``fused_<variant>`` for a kernel variant (fused_variants()), all on the same inputs.
    Raises ValueError for an unknown impl or a bad configuration (before running anything)."""
    from hotpaths.bench import attention_prologue_peers as peers
    from hotpaths.harness import bench as hb
    from hotpaths.harness.env import device_tag, has_sm90

    bad = [i for i in impls if i not in IMPLS and variant_of(i) is None]
    if bad:
        raise ValueError(f"impl: unknown {bad}; expected some of {IMPLS} or "
                         f"{tuple(VARIANT_PREFIX + v for v in fused_variants())}")
    if head_dim not in ref.HEAD_DIMS:
        raise ValueError(f"head_dim {head_dim} unsupported (supported: {ref.HEAD_DIMS})")
    if q_heads < 1 or kv_heads < 1 or q_heads % kv_heads:
        raise ValueError(f"q_heads {q_heads} / kv_heads {kv_heads}: expected q_heads a positive multiple of kv_heads")
    for t in tokens_list:
        mode_of(t, mode)
    gpu = has_sm90()
    dev = "cuda" if gpu else "cpu"
    tag = device_tag()
    floor = hb.timing_floor(1) if gpu else None
    cfg = dict(q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim, page_size=page_size, norm_order=norm_order,
               rope=rope, kv_dtype=kv_dtype, q_dtype=q_dtype)
    rows = []
    for t in tokens_list:
        m = mode_of(t, mode)
        inputs = make_bench_inputs(t, mode=m, rotary_dim=rotary_dim, eps=eps, device=dev, seed=seed, **cfg)
        nbytes = ref.bytes(t, q_heads, kv_heads, head_dim, q_dtype=q_dtype, kv_dtype=kv_dtype,
                           rotary_dim=inputs["rotary_dim"])
        probe = hb.read_probe(nbytes) if gpu else None
        dep = dependent_load_floor(inputs) if gpu else None
        memo: dict = {}  # the emulation of these inputs, shared by every impl's check
        for impl in impls:
            row = {"op": OP, "case": case_name(q_heads, kv_heads, m, t), "impl": impl,
                   "dtype": f"q {q_dtype}, kv {kv_dtype}", "device": tag, "bytes": nbytes, "tokens": t, "mode": m,
                   "q_heads": q_heads, "kv_heads": kv_heads, "head_dim": head_dim, "repro": _repro(t, cfg, impl),
                   "floor_us": None if floor is None else floor.median_us,
                   "dep_floor_us": None if dep is None else dep.median_us}
            fn, reason, graph = None, None, True
            ours = variant_of(impl) is not None
            if ours:
                if gpu:
                    fn = make_fused(inputs, variant=variant_of(impl))
                else:
                    a, kw = op_args(inputs)
                    out = ref.attention_prologue_emulation(*a, **kw)
                    row.update(impl=impl + "_emulation", note="no SM90 GPU: the same-precision emulation, untimed")
                    row.update(_errors(out, inputs, ERR_TOKENS))
                    rows.append(row)
                    continue
            elif impl in ("torch_unfused", "torch_unfused_graph"):
                graph = impl == "torch_unfused_graph"
                fn, reason = peers.try_make("torch_unfused", inputs, allow_cpu=not gpu)
                if fn is not None and not gpu:
                    out = fn()
                    row.update(impl=impl + "_emulation", note="no SM90 GPU: the torch sequence on the CPU, untimed")
                    row.update(_errors(out, inputs, ERR_TOKENS))
                    if check:
                        row.update(_mismatch(out, inputs, CHECK_TOKENS, memo))
                    rows.append(row)
                    continue
            else:
                fn, reason = peers.try_make(impl, inputs)
            if fn is None:
                row["note"] = reason
                rows.append(row)
                continue
            convert = getattr(fn, "convert", lambda o: o)
            try:
                out = convert(fn())
                torch.cuda.synchronize()
                row.update(_errors(out, inputs, ERR_TOKENS))
                if check:
                    row.update(_mismatch(out, inputs, CHECK_TOKENS, memo))
                    if not ours:
                        row["note"] = ("mismatch columns count bytes that differ from our reference's; compare "
                                       "rel_l2_err / k_rel_l2_err (vs the exact reference)")
            except Exception as e:  # a peer whose output we cannot read still gets its timing
                row["note"] = f"output not compared: {type(e).__name__}: {str(e)[:200]}"
            if impl in ("flashinfer_fused",):
                row["note"] = ((row.get("note") or "") + " eps fixed at 1e-6 by the peer").strip()
            try:
                tm = hb.bench(fn, graph=graph, iters=iters)
            except Exception as e:  # e.g. a peer that cannot be captured in a graph: a reason, not a crash
                if ours:
                    raise
                row["note"] = (row.get("note") or "") + f" timing failed: {type(e).__name__}: {str(e)[:200]}"
                rows.append(row)
                continue
            row.update(tm.as_row(), timing=tm.method)
            row["gbps"] = nbytes / (tm.median_us * 1e-6) / 1e9
            row.update(hb.read_probe_columns(tm.median_us, nbytes, probe=probe))
            if floor is not None:
                row["over_floor_us"] = tm.median_us - floor.median_us
            if dep is not None:
                row["over_dep_floor_us"] = tm.median_us - dep.median_us
            rows.append(row)
    return rows


def unfused_traffic(tokens: int, q_heads: int = 8, kv_heads: int = 1, head_dim: int = 128, *,
                    kv_dtype: str = "fp8") -> list[dict]:
    """HBM bytes of the prologue done as separate passes, each at its ideal (one read of its inputs, one write of its
    outputs, fp32 intermediates as torch keeps them), against the one fused pass: what each fusion saves. A model,
    not a measurement (eager torch runs several kernels per stage and moves more). Rows: stage, bytes, launches."""
    E_qk = tokens * (q_heads + kv_heads) * head_dim
    E_q, E_k, E_v = tokens * q_heads * head_dim, tokens * kv_heads * head_dim, tokens * kv_heads * head_dim
    kvb = 1 if kv_dtype == "fp8" else 2
    rows = [
        {"stage": "RMSNorm Q, K (bf16 in, fp32 out)", "bytes": 2 * E_qk + 4 * E_qk, "launches": 1},
        {"stage": "RoPE Q, K (fp32 in/out, cos/sin gathered)", "bytes": 8 * E_qk + tokens * 4 * head_dim,
         "launches": 1},
        {"stage": "Q amax + scale + FP8 cast", "bytes": 4 * E_q + 4 * E_q + E_q + tokens * q_heads * 4, "launches": 2},
        {"stage": "K, V cast + cache write", "bytes": 4 * E_k + 2 * E_v + kvb * (E_k + E_v) + 16 * tokens,
         "launches": 2},
    ]
    rows.append({"stage": "unfused total", "bytes": sum(r["bytes"] for r in rows),
                 "launches": sum(r["launches"] for r in rows)})
    rows.append({"stage": "fused (one pass)", "bytes": ref.bytes(tokens, q_heads, kv_heads, head_dim, kv_dtype=kv_dtype,
                                                                 q_dtype="fp8"), "launches": 1})
    return rows


# ----------------------------------------------------------------------------------------------------------------
# chain into decode attention


def make_chain_inputs(case: str, *, q_len: int = 1, q_heads: int = 8, kv_heads: int = 1, page_size: int = 64,
                      kv_dtype: str = "fp8", norm_order: str = "norm_rope", rope: str = "neox", device="cuda",
                      seed: int = 0) -> dict:
    """Decode inputs (hotpaths.reference.split_kv_decode.make_decode_inputs) plus the prologue's inputs for the
    step's new tokens: the last q_len tokens of each request (positions L-q_len..L-1, slots from the block table),
    a fresh qkv for them, q_dtype = the cache's dtype. Returns {"decode": ..., "prologue": ...}.
    Raises ValueError for a request shorter than q_len or a configuration either op rejects."""
    from hotpaths.reference import split_kv_decode as dref
    from hotpaths.reference.common import expand_lengths

    lens = expand_lengths(case)
    if min(lens) < q_len:
        raise ValueError(f"case {case!r}: every request needs KV length >= q_len {q_len}")
    dec = dref.make_decode_inputs(lens, q_heads=q_heads, kv_heads=kv_heads, head_dim=128, page_size=page_size,
                                  q_len=q_len, kv_dtype=kv_dtype, device="cpu", seed=seed)
    T = len(lens) * q_len
    pro = ref.make_prologue_inputs(T, q_heads=q_heads, kv_heads=kv_heads, head_dim=128, page_size=page_size,
                                   kv_dtype=kv_dtype, q_dtype=kv_dtype, norm_order=norm_order, rope=rope,
                                   max_pos=max(lens), seed=seed + 7)
    bt = dec["block_table"]
    pos, slot = [], []
    for r, L in enumerate(lens):
        for p in range(L - q_len, L):
            pos.append(p)
            slot.append(int(bt[r, p // page_size]) * page_size + p % page_size)
    pro["positions"] = torch.tensor(pos, dtype=torch.int64)
    pro["slot_mapping"] = torch.tensor(slot, dtype=torch.int64)
    pro["k_cache"], pro["v_cache"] = dec["k_cache"], dec["v_cache"]
    if kv_dtype == "fp8":
        pro["k_scale"], pro["v_scale"] = dec["k_scale"], dec["v_scale"]
    dev = torch.device(device)
    def mv(d):
        return {k: (v.to(dev).contiguous() if isinstance(v, torch.Tensor) else v) for k, v in d.items()}
    dec, pro = mv(dec), mv(pro)
    pro["k_cache"], pro["v_cache"] = dec["k_cache"], dec["v_cache"]  # one cache, written then read
    if kv_dtype == "fp8":
        pro["k_scale"], pro["v_scale"] = dec["k_scale"], dec["v_scale"]
    return {"decode": dec, "prologue": pro, "lens": lens, "q_len": q_len}


def make_chain(ci: dict, *, trigger: bool = True, early: bool = False, assign: bool = False):
    """fn() running prologue then split-KV decode on its q / q_scale (capturable); returns the decode output.
    Also returns the two halves: (chain, prologue_only, decode_only). trigger: as make_fused(); early: the decode
    plan's early work before its PDL waits (hotpaths.kernels.split_kv_decode.plan(early=...)); assign: the decode
    half re-plans first (plan.update: the step's assign kernel, right after the prologue)."""
    from hotpaths.kernels import split_kv_decode as sk

    dec, pro = ci["decode"], ci["prologue"]
    H = dec["k_cache"].shape[2]
    Hq = dec["q"].shape[1]
    plan = sk.plan(dec["kv_lens"], num_kv_heads=H, q_heads=Hq, head_dim=128, q_len=ci["q_len"],
                   kv_dtype=dec["k_cache"].dtype, early=early)
    pf = make_fused(pro, trigger=trigger)
    q, qs, _, _ = pf()
    out = torch.empty((q.shape[0], Hq, 128), dtype=torch.bfloat16, device=q.device)
    fp8 = dec["k_cache"].dtype == ref.FP8_DTYPE
    kws = dict(q_scale=qs, k_scale=dec["k_scale"], v_scale=dec["v_scale"]) if fp8 else {}

    def decode():
        if assign:
            plan.update(dec["kv_lens"])
        return sk.run(plan, q, dec["k_cache"], dec["v_cache"], dec["block_table"], dec["kv_lens"], q_len=ci["q_len"],
                      out=out, check_inputs=False, **kws)

    def chain():
        pf()
        return decode()
    chain.plan = plan
    return chain, pf, decode


def chain_rows(cases, *, q_len: int = 1, q_heads: int = 8, kv_heads: int = 1, kv_dtype: str = "fp8",
               iters: int = 100, seed: int = 0) -> list[dict]:
    """Rows (impl prologue / decode / sum_alone / chain_pdl / chain_no_trigger / chain_pdl_early, and with the
    step's assign decode_assign / sum_alone_assign / chain_assign_pdl / chain_assign_pdl_early: the module
    docstring) per decode case: each alone, their sum, and the two in one graph; ``saved_us`` = sum - chain.
    SM90 only: without it one row per case says why. Raises ValueError for a bad case."""
    from hotpaths.harness import bench as hb
    from hotpaths.harness.env import device_tag, has_sm90, sm90_skip_reason

    rows = []
    tag = device_tag()
    if not has_sm90():
        for c in cases:
            rows.append({"op": OP, "case": f"chain-{c}-q{q_len}", "impl": "chain_pdl", "device": tag,
                         "note": f"not run: {sm90_skip_reason()}"})
        return rows
    floor = hb.timing_floor(1)
    for c in cases:
        ci = make_chain_inputs(c, q_len=q_len, q_heads=q_heads, kv_heads=kv_heads, kv_dtype=kv_dtype, seed=seed)
        chain_t, pf_t, dec_fn = make_chain(ci, trigger=True)
        chain_n, pf_n, _ = make_chain(ci, trigger=False)
        chain_e, _, _ = make_chain(ci, trigger=True, early=True)
        chain_a, _, dec_a = make_chain(ci, trigger=True, assign=True)
        chain_ae, _, _ = make_chain(ci, trigger=True, early=True, assign=True)
        times = {"prologue": hb.bench(pf_t, iters=iters), "decode": hb.bench(dec_fn, iters=iters),
                 "chain_pdl": hb.bench(chain_t, iters=iters), "chain_no_trigger": hb.bench(chain_n, iters=iters),
                 "chain_pdl_early": hb.bench(chain_e, iters=iters), "decode_assign": hb.bench(dec_a, iters=iters),
                 "chain_assign_pdl": hb.bench(chain_a, iters=iters),
                 "chain_assign_pdl_early": hb.bench(chain_ae, iters=iters)}
        s = times["prologue"].median_us + times["decode"].median_us
        sa = times["prologue"].median_us + times["decode_assign"].median_us
        base = {"op": OP, "case": f"chain-{c}-q{q_len}", "device": tag, "dtype": f"q {kv_dtype}, kv {kv_dtype}",
                "tokens": len(ci["lens"]) * q_len, "mode": "decode", "q_heads": q_heads, "kv_heads": kv_heads,
                "head_dim": 128, "floor_us": floor.median_us if floor else None,
                "repro": f"hotpaths prologue --chain {c} --q-len {q_len} --q-heads {q_heads} --kv-heads {kv_heads} "
                         f"--kv-dtype {kv_dtype}"}
        for name, tm in times.items():
            r = dict(base, impl=name, timing=tm.method, **tm.as_row())
            if name.startswith("chain"):
                r["saved_us"] = (sa if "assign" in name else s) - tm.median_us
            rows.append(r)
        rows.append(dict(base, impl="sum_alone", median_us=s))
        rows.append(dict(base, impl="sum_alone_assign", median_us=sa))
    return rows


# ----------------------------------------------------------------------------------------------------------------
# CLI: hotpaths prologue


def register(subparsers) -> None:
    """Add ``hotpaths prologue`` to the CLI's subparsers (hotpaths.harness.cli finds it through hotpaths.bench.OPS)."""
    from hotpaths.harness.cli import add_op_command
    from hotpaths.harness.shapes import case_list_arg, int_list_arg

    p = add_op_command(
        subparsers, "prologue", func=_run,
        help="fused attention prologue (QK-Norm, RoPE, FP8 Q, paged K/V write): latency and error",
        description="Runs each --impl at each token count on fresh random inputs (decode: one token per request at "
        "the end of a 64-511 token sequence; prefill: one request) and reports median/p10/p90 us (CUDA-graph "
        "replay, L2 flushed), bytes, the read probe of the same bytes, the one-kernel timing floor, and Q / K error "
        "vs the exact reference. --check also compares Q, scales and cache rows bit for bit with the emulation. "
        "--chain CASES times prologue + split-KV decode in one graph instead. Without an SM90 GPU the emulations "
        "run (impl *_emulation, untimed).")
    p.add_argument("--tokens", type=int_list_arg("--tokens", minimum=1), default=[1, 7, 64, 4096],
                   help="comma-separated token counts (default 1,7,64,4096)")
    p.add_argument("--q-heads", type=int, default=8, help="query heads (default 8: Hy3 under TP8)")
    p.add_argument("--kv-heads", type=int, default=1, help="KV heads (default 1)")
    p.add_argument("--head-dim", type=int, default=128, help="head dim: 64, 128 or 256 (default 128)")
    p.add_argument("--page-size", type=int, default=64, help="KV cache page size (default 64)")
    p.add_argument("--rotary-dim", type=int, default=None, help="rotary dim, a multiple of 16 (default head dim)")
    p.add_argument("--eps", type=float, default=ref.DEFAULT_EPS, help="RMSNorm eps (default 1e-5, Hy3's)")
    p.add_argument("--norm-order", choices=ref.NORM_ORDERS, default="norm_rope", help="default norm_rope (Hy3)")
    p.add_argument("--rope", choices=ref.ROPE_STYLES, default="neox", help="default neox")
    p.add_argument("--kv-dtype", choices=("fp8", "bf16"), default="fp8", help="cache dtype (default fp8)")
    p.add_argument("--q-dtype", choices=("fp8", "bf16"), default=None, help="Q dtype (default: the cache's)")
    p.add_argument("--mode", choices=("auto", "decode", "prefill"), default="auto",
                   help=f"token layout (auto: decode up to {DECODE_MAX} tokens)")
    p.add_argument("--impl", default=",".join(IMPLS),
                   help=f"comma-separated impls among {', '.join(IMPLS)}")
    p.add_argument("--variants", default=None, metavar="NAMES",
                   help="comma-separated kernel variants (auto, baseline, pair, tokwarp2): 'fused' in --impl "
                   "becomes one row per variant (fused_<name>), all on the same inputs")
    p.add_argument("--check", action="store_true", help="bit-exact comparison with the emulation")
    p.add_argument("--chain", type=case_list_arg, default=None, metavar="CASES",
                   help="time prologue + decode attention for these decode cases (e.g. 64x0.5K,32x4K)")
    p.add_argument("--q-len", type=int, default=1, help="new tokens per request in --chain (1-4, default 1)")


def _run(args) -> int:
    from hotpaths.harness import tables
    from hotpaths.harness.cli import emit_rows

    if args.chain:
        if not 1 <= args.q_len <= 4:
            raise ValueError(f"--q-len: expected 1-4, got {args.q_len}")
        rows = chain_rows(args.chain, q_len=args.q_len, q_heads=args.q_heads, kv_heads=args.kv_heads,
                          kv_dtype=args.kv_dtype, iters=args.iters, seed=args.seed)
    else:
        impls = [s.strip() for s in args.impl.split(",") if s.strip()]
        if args.variants:
            names = [v.strip() for v in args.variants.split(",") if v.strip()]
            bad = [v for v in names if v not in fused_variants()]
            if bad:
                raise ValueError(f"--variants: unknown {bad}; expected some of {fused_variants()}")
            at = impls.index("fused") if "fused" in impls else 0
            impls = impls[:at] + [VARIANT_PREFIX + v for v in names] + [i for i in impls[at:] if i != "fused"]
        rows = prologue_rows(args.tokens, q_heads=args.q_heads, kv_heads=args.kv_heads, head_dim=args.head_dim,
                             page_size=args.page_size, norm_order=args.norm_order, rope=args.rope,
                             kv_dtype=args.kv_dtype, q_dtype=args.q_dtype or args.kv_dtype,
                             rotary_dim=args.rotary_dim, eps=args.eps, impls=impls, mode=args.mode, check=args.check,
                             iters=args.iters, seed=args.seed)
    if not emit_rows(rows, args, title="attention prologue"):
        df = tables.normalize(rows)
        cols = [c for c in ("case", "impl", "median_us", "pct_of_read_probe", "over_floor_us", "saved_us",
                            "rel_l2_err", "k_rel_l2_err", "q_mismatch", "cache_mismatch", "note") if c in df.columns]
        print(df[cols].to_string(index=False))
    return 0


def auto_vs_fastest(df):
    """Per case of a variants table (rows ``fused_<variant>`` with tokens, q_heads, kv_heads, median_us): the
    variant ``auto`` runs (choose_variant), the fastest measured one, and auto's time over the fastest. Returns a
    pandas DataFrame (case, auto_pick, fastest, auto_us, fastest_us, auto_over_fastest); cases where auto's pick was
    not timed are left out."""
    import pandas as pd

    from hotpaths.kernels.attention_prologue import choose_variant

    timed = df[df["impl"].astype(str).str.startswith(VARIANT_PREFIX) & df["median_us"].notna()]
    out = []
    for case, g in timed.groupby("case", sort=False):
        t = {str(i)[len(VARIANT_PREFIX):]: float(u) for i, u in zip(g["impl"], g["median_us"])}
        r = g.iloc[0]
        pick = choose_variant(int(r["tokens"]), int(r["q_heads"]), int(r["kv_heads"]))
        if pick not in t:
            continue
        best = min(t, key=t.get)
        out.append({"case": case, "auto_pick": pick, "fastest": best, "auto_us": t[pick], "fastest_us": t[best],
                    "auto_over_fastest": t[pick] / t[best]})
    return pd.DataFrame(out)


__all__ = ["IMPLS", "VARIANT_PREFIX", "auto_vs_fastest", "fused_variants", "variant_of", "case_name", "mode_of",
           "request_layout",
           "make_bench_inputs", "make_fused", "prologue_rows", "make_chain_inputs", "make_chain", "chain_rows",
           "register", "unfused_traffic"]
