"""Benchmark driver for split-KV decode attention: the tables of notebook 02 and `hotpaths decode`.

Tables (all rows: tables.COLUMNS first, then the extra columns listed in EXTRA_COLUMNS):
- ``decode_kv_distribution`` (decode_rows): per case x KV dtype x impl: correctness vs the fp64 reference on the
  same quantized inputs (output NaN-poisoned before the first launch), then the median of CUDA-graph replays with
  L2 flushed before each (hotpaths.harness.bench). Time per layer = attention + combine: ``run()`` only; the task
  map (plan / assign) is built once per step and reported separately as impl ``assign_only``.
- ``decode_skew_sweep`` (skew_sweep_rows): constant total tokens, one request growing from 1/batch of them.
- ``decode_fixed_costs`` (overhead_rows): assign alone by batch size (the kernel API has no combine-only entry, so
  combine is not timed alone; the row says so).
- ``decode_ncu`` (ncu_rows): Nsight Compute of the dynamic kernel on two cases.
Without an SM90 GPU the kernel impls become ``<impl>_emulation`` rows (hotpaths.reference's same-precision
emulation over the same task map) with correctness and no timing; peers record why they did not run.

bytes = K and V read once + Q + the bf16 output (hotpaths.reference.split_kv_decode.bytes_moved); gbps = bytes /
median; pct_of_ceiling = gbps / the device-to-device copy bandwidth measured in the same run.
"""

from __future__ import annotations

import math
import shlex
from types import SimpleNamespace

from hotpaths.reference.split_kv_decode import DEFAULT_MIN_TILES

OP = "split_kv_decode"
OUR_IMPLS = ("dynamic", "static_count", "static_chunk", "batch_invariant")
STATIC_IMPLS = ("static_count", "static_chunk")
# The 9 cases of issue 3: the six published ones, then three more skewed ones.
ISSUE_CASES = ("64x0.5K", "64x4K", "32x0.125K+32x4K", "2x32K+30x4K", "1x64K+15x4K", "1x128K+31x4K",
               "1x16K+15x64", "1x64K+7x4K", "1x64K+31x4K")
NCU_CASES = ("64x4K", "1x128K+31x4K")
H200_SMS = 132  # persistent grid of the emulation on CPU (the kernel defaults to the device's SM count)
DTYPE_LABEL = {"fp8": "fp8_kv", "bf16": "bf16_kv"}
EXTRA_COLUMNS = ["kv_bytes", "floor_us", "dynamic_vs_static", "published_dynamic_vs_static", "hpc_ops_h200_us",
                 "check_passed", "method", "note"]

# HPC-Ops' kernels measured on this H200 model (CUDA-graph replay, L2 flushed before each replay, median us):
# FP8 dynamic / FP8 static / BF16 dynamic. Source: issue 3 of this repository ("Targets"), measured by the
# project with the HPC-Ops library (not installable offline, so not re-run here).
HPC_OPS_H200_US = {
    "64x0.5K": (14.7, 13.1, 18.4), "64x4K": (33.2, 36.9, 50.8), "32x0.125K+32x4K": (23.9, 32.3, 34.4),
    "1x16K+15x64": (15.3, 30.5, 15.0), "1x64K+7x4K": (23.8, 88.8, 32.2), "1x64K+15x4K": (25.2, 90.0, 35.9),
    "1x64K+31x4K": (30.7, 95.1, 45.0), "1x128K+31x4K": (35.7, 172.8, 54.0), "2x32K+30x4K": (30.2, 56.4, 44.4),
}

_PUBLISHED_COL = {"dynamic": "hpc_dynamic_ms", "static_count": "hpc_static_ms", "static_chunk": "hpc_static_ms",
                  "static": "hpc_static_ms", "flashinfer": "flashinfer_ms", "flashattention": "flashattention_ms"}


def _base_impl(impl: str) -> str:
    return impl[: -len("_emulation")] if impl.endswith("_emulation") else impl


def _same_case(a: str, b: str) -> bool:
    from hotpaths.harness.shapes import parse_cases

    try:
        return parse_cases(a) == parse_cases(b)
    except ValueError:
        return False


def _lookup(table: dict, case: str):
    for k, v in table.items():
        if _same_case(k, case):
            return v
    return None


def published_h20_us(case: str, impl: str, kv_dtype: str = "fp8") -> float | None:
    """The published H20 figure (us) for (case, impl) from data/reported/decode_fp8_kv_distribution_h20.csv.

    dynamic <- hpc_dynamic_ms, static_count/static_chunk <- hpc_static_ms, flashinfer <- flashinfer_ms,
    flashattention <- flashattention_ms (x1000). The published table is FP8 KV only: None for bf16, for impls or
    cases it lacks. Raises nothing.
    """
    col = _PUBLISHED_COL.get(_base_impl(impl))
    if kv_dtype not in ("fp8", "fp8_kv") or col is None:
        return None
    from hotpaths.harness.tables import published

    df = published(OP)
    for _, row in df.iterrows():
        if _same_case(str(row["case"]), case):
            v = row.get(col)
            return None if v is None or (isinstance(v, float) and math.isnan(v)) else round(float(v) * 1000, 3)
    return None


def published_dynamic_vs_static(case: str) -> float | None:
    from hotpaths.harness.tables import published

    df = published(OP)
    for _, row in df.iterrows():
        if _same_case(str(row["case"]), case):
            return float(row["dynamic_vs_static"])
    return None


def hpc_ops_h200_us(case: str, impl: str, kv_dtype: str) -> float | None:
    """HPC-Ops on the H200 (HPC_OPS_H200_US) for the matching (case, impl, dtype), else None."""
    v = _lookup(HPC_OPS_H200_US, case)
    if v is None:
        return None
    base = _base_impl(impl)
    fp8 = kv_dtype in ("fp8", "fp8_kv")
    if base == "dynamic":
        return v[0] if fp8 else v[2]
    if base in STATIC_IMPLS and fp8:
        return v[1]
    return None


def repro(case: str, impl: str, kv_dtype: str, *, q_heads=8, kv_heads=1, head_dim=128, page_size=64,
          q_len=1) -> str:
    """The `hotpaths decode ...` command reproducing one row."""
    return (f"hotpaths decode --cases {shlex.quote(case)} --kv-dtype {kv_dtype} --q-heads {q_heads} "
            f"--kv-heads {kv_heads} --head-dim {head_dim} --page-size {page_size} --q-len {q_len} "
            f"--impl {_base_impl(impl)} --check --json")


def kernel_unavailable_reason() -> str | None:
    """None when the SM90 kernels can run here, else why (no GPU / not SM90 / build failure)."""
    from hotpaths.harness.env import sm90_skip_reason

    r = sm90_skip_reason()
    if r:
        return r
    try:
        from hotpaths.kernels.split_kv_decode import _load

        _load()
    except Exception as e:
        return f"kernel build/load failed: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
    return None


def emulation_task_map(lens, impl: str, *, kv_heads: int, num_ctas: int = H200_SMS, min_tiles: int = DEFAULT_MIN_TILES,
                       num_splits: int | None = None, chunk_tiles: int | None = None):
    """The host TaskMap the kernel would use for ``impl`` (via the kernel package's own host_task_map mapping)."""
    from hotpaths.kernels import split_kv_decode as K

    batch = len(lens)
    if impl == "static_count":
        splits = num_splits or max(1, -(-num_ctas // (batch * kv_heads)))
    else:
        splits = 1
    p = SimpleNamespace(mode=impl, num_kv_heads=kv_heads, num_ctas=num_ctas, min_tiles=min_tiles,
                        max_pairs=batch * kv_heads, splits=splits,
                        chunk_tiles=chunk_tiles or K.DEFAULT_CHUNK_TILES)
    return K.host_task_map(p, lens)


def case_numbers(cases, *, kv_dtypes=("fp8", "bf16"), q_heads=8, kv_heads=1, head_dim=128, q_len=1,
                 ceilings=None, timing_floor_us=None) -> list[dict]:
    """The two numbers per case: bytes (KV once + Q + out) and FLOPs, and the floor times.

    floor_us = bytes / measured copy bandwidth (None without a GPU); timing_floor_us = the measured time of one
    trivial graph-replayed kernel after an L2 flush (bench.timing_floor), the floor under any row.
    """
    from hotpaths.harness.shapes import expand_lengths
    from hotpaths.reference.split_kv_decode import bytes_moved, flops

    rows = []
    copy = (ceilings or {}).get("copy_gbps")
    for case in cases:
        lens = expand_lengths(case)
        for kv in kv_dtypes:
            b = bytes_moved(lens, kv_heads, head_dim, kv, q_heads, q_len)
            kvb = 2 * sum(lens) * kv_heads * head_dim * (1 if kv == "fp8" else 2)
            rows.append(dict(case=case, dtype=DTYPE_LABEL[kv], requests=len(lens), kv_tokens=sum(lens),
                             kv_mb=kvb / 2**20, bytes=b, flops=flops(lens, q_heads, head_dim, q_len),
                             floor_us=(b / copy / 1e3) if copy else None, timing_floor_us=timing_floor_us))
    return rows


def _row(case, impl, kv, *, device, bytes_, kv_bytes, ceilings, timing=None, chk=None, note="", cfg=None):
    from hotpaths.harness.ceilings import pct_of_ceiling
    from hotpaths.harness.runs import run_id

    cfg = cfg or {}
    med = timing.median_us if timing is not None else None
    gbps = bytes_ / med / 1e3 if (med and bytes_) else None
    copy = (ceilings or {}).get("copy_gbps")
    row = dict(op=OP, case=case, impl=impl, dtype=DTYPE_LABEL.get(kv, kv), device=device,
               median_us=med, p10_us=timing.p10_us if timing else None, p90_us=timing.p90_us if timing else None,
               bytes=bytes_, gbps=gbps, pct_of_ceiling=pct_of_ceiling(gbps, ceilings),
               rel_l2_err=chk.rel_l2_err if chk else None, max_abs_err=chk.max_abs_err if chk else None,
               cosine=chk.cosine if chk else None, published_h20_us=published_h20_us(case, impl, kv),
               run_id=run_id(), repro=repro(case, impl, kv, **cfg),
               kv_bytes=kv_bytes, floor_us=(bytes_ / copy / 1e3) if (copy and bytes_) else None,
               dynamic_vs_static=None, published_dynamic_vs_static=published_dynamic_vs_static(case),
               hpc_ops_h200_us=hpc_ops_h200_us(case, impl, kv),
               check_passed=chk.passed if chk else None, method=timing.method if timing else None, note=note)
    return row


def _fill_ratios(rows: list[dict]) -> None:
    """dynamic_vs_static: on static rows their median / dynamic's; on the dynamic row the faster static's / its."""
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["case"], r["dtype"]), {})[r["impl"]] = r
    for g in groups.values():
        dyn = g.get("dynamic")
        if not dyn or not dyn["median_us"]:
            continue
        stat = [g[s]["median_us"] for s in STATIC_IMPLS if s in g and g[s]["median_us"]]
        for s in STATIC_IMPLS:
            if s in g and g[s]["median_us"]:
                g[s]["dynamic_vs_static"] = g[s]["median_us"] / dyn["median_us"]
        if stat:
            dyn["dynamic_vs_static"] = min(stat) / dyn["median_us"]


def _device_tag():
    from hotpaths.harness.env import device_tag

    return device_tag()


def decode_rows(cases=ISSUE_CASES, *, kv_dtypes=("fp8", "bf16"), impls=OUR_IMPLS + ("torch_sdpa_gathered",
                "flex_attention_decode", "flashinfer"), q_heads=8, kv_heads=1, head_dim=128, page_size=64,
                q_len=1, ceilings=None, iters=100, warmup=10, seed=0, num_ctas=None, min_tiles=DEFAULT_MIN_TILES, num_splits=None,
                chunk_tiles=None, assign=True, log=print) -> list[dict]:
    """Rows of table ``decode_kv_distribution`` (see the module docstring).

    cases: case strings (``"1x128K+31x4K"``). impls: our modes (OUR_IMPLS) and peers (hotpaths.harness.peers).
    On an SM90 GPU each impl is checked (poisoned output, vs split_kv_decode_ref) then timed; a failing impl or
    peer becomes a row with its reason in ``note``. Without SM90: ``<impl>_emulation`` rows (correctness only)
    and peers' reasons. ceilings: hotpaths.harness.ceilings.measure() (measured here when None on a GPU).
    Raises CaseError for a malformed case, ValueError for an unknown impl or kv dtype.
    """
    import torch

    from hotpaths.harness import peers as P
    from hotpaths.harness.bench import bench
    from hotpaths.harness.check import check
    from hotpaths.harness.shapes import expand_lengths, parse_cases
    from hotpaths.reference import split_kv_decode as ref

    for c in cases:
        parse_cases(c)
    bad = [i for i in impls if i not in OUR_IMPLS and i not in P.PEER_NAMES]
    if bad:
        raise ValueError(f"impls: unknown {bad}; known: {OUR_IMPLS + P.PEER_NAMES}")
    bad = [k for k in kv_dtypes if k not in DTYPE_LABEL]
    if bad:
        raise ValueError(f"kv_dtypes: expected 'fp8' and/or 'bf16', got {bad}")
    kreason = kernel_unavailable_reason()
    gpu = torch.cuda.is_available()
    if ceilings is None and gpu:
        from hotpaths.harness.ceilings import measure

        ceilings = measure()
    device = _device_tag()
    dev = "cuda" if gpu else "cpu"
    cfg = dict(q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim, page_size=page_size, q_len=q_len)
    rows: list[dict] = []
    from hotpaths.harness.progress import progress

    for case in progress(cases, desc="decode"):
        lens = expand_lengths(case)
        for kv in kv_dtypes:
            inputs = ref.make_decode_inputs(lens, kv_dtype=kv, device=dev, seed=seed, **cfg)
            refo = ref.split_kv_decode_ref(**inputs)
            nbytes = ref.bytes_moved(lens, kv_heads, head_dim, kv, q_heads, q_len)
            kvb = 2 * sum(lens) * kv_heads * head_dim * (1 if kv == "fp8" else 2)
            path = f"{kv}_vs_exact"
            common = dict(device=device, bytes_=nbytes, kv_bytes=kvb, ceilings=ceilings, cfg=cfg)
            kargs = {k: inputs[k] for k in ("q_scale", "k_scale", "v_scale")}
            for impl in impls:
                if impl in OUR_IMPLS and kreason is not None:
                    tm = emulation_task_map(lens, impl, kv_heads=kv_heads, num_ctas=num_ctas or H200_SMS,
                                            min_tiles=min_tiles, num_splits=num_splits, chunk_tiles=chunk_tiles)
                    from hotpaths.kernels.split_kv_decode import p_dtype_for

                    o = ref.split_kv_decode_emulation(**inputs, task_map=tm, p_dtype=p_dtype_for(kv == "fp8"))
                    rows.append(_row(case, impl + "_emulation", kv, chk=check(o, refo, op=OP, path=path),
                                     note=f"emulation (no timing): {kreason}", **common))
                    continue
                if impl in OUR_IMPLS:
                    rows += _time_ours(impl, case, kv, inputs, refo, path, common, kargs, iters=iters,
                                       warmup=warmup, num_ctas=num_ctas, min_tiles=min_tiles, num_splits=num_splits,
                                       chunk_tiles=chunk_tiles, assign=assign)
                    continue
                fn, reason = P.try_make(impl, inputs)
                if fn is None:
                    rows.append(_row(case, impl, kv, note=reason, **common))
                    continue
                try:
                    out = fn()  # peers allocate their output NaN-filled, so this first call checks poisoned
                    torch.cuda.synchronize()
                    chk = check(out, refo, op=OP, path=path)
                    t = bench(fn, iters=iters, warmup=warmup)
                    note = _peer_note(impl, kv) + (f"; {fn.note}" if getattr(fn, "note", "") else "")
                    rows.append(_row(case, impl, kv, timing=t, chk=chk, note=note, **common))
                except Exception as e:
                    rows.append(_row(case, impl, kv, note=f"failed: {type(e).__name__}: "
                                     f"{str(e).splitlines()[0][:300] if str(e) else ''}", **common))
                del fn
            if log:
                done = [r for r in rows if r["case"] == case and r["dtype"] == DTYPE_LABEL[kv]]
                log(f"{case} {kv}: " + ", ".join(
                    f"{r['impl']}={r['median_us']:.1f}us" if r["median_us"] else f"{r['impl']}=-" for r in done))
            del inputs, refo
            if gpu:
                torch.cuda.empty_cache()
    _fill_ratios(rows)
    return rows


def _peer_note(impl: str, kv: str) -> str:
    if impl == "flashinfer":
        return ("FlashInfer 0.3.1 JIT, tensor cores, CUDA graph; Q bf16 (q_fp8*q_scale)" if kv == "fp8"
                else "FlashInfer 0.3.1 JIT, tensor cores, CUDA graph")
    extra = "; fp8 K/V read as bf16 (2x bytes), k_scale folded into Q" if kv == "fp8" else ""
    if impl == "torch_sdpa_gathered":
        return "gather not timed; one SDPA call per distinct length" + extra
    return "packed + document block mask, torch.compile; gather and block mask not timed" + extra


def _time_ours(impl, case, kv, inputs, refo, path, common, kargs, *, iters, warmup, num_ctas, min_tiles,
               num_splits, chunk_tiles, assign):
    import torch

    from hotpaths.harness.bench import bench
    from hotpaths.harness.check import check
    from hotpaths.kernels import split_kv_decode as K

    rows = []
    kw = dict(num_kv_heads=inputs["k_cache"].shape[2], q_heads=inputs["q"].shape[1],
              head_dim=inputs["q"].shape[2], num_ctas=num_ctas, min_tiles=min_tiles, mode=impl,
              q_len=inputs["q_len"], kv_dtype=inputs["k_cache"].dtype)
    if impl == "static_count":
        kw["num_splits"] = num_splits
    if impl in ("static_chunk", "batch_invariant"):
        kw["chunk_tiles"] = chunk_tiles
    try:
        p = K.plan(inputs["kv_lens"], **kw)
        out = torch.full(tuple(inputs["q"].shape), float("nan"), dtype=torch.bfloat16, device=inputs["q"].device)
        args = (p, inputs["q"], inputs["k_cache"], inputs["v_cache"], inputs["block_table"], inputs["kv_lens"])
        K.run(*args, q_len=inputs["q_len"], out=out, **kargs)
        torch.cuda.synchronize()
        chk = check(out, refo, op=OP, path=path)
        t = bench(lambda: K.run(*args, q_len=inputs["q_len"], out=out, check_inputs=False, **kargs),
                  iters=iters, warmup=warmup)
        note = (f"num_ctas={p.num_ctas}, splits={p.splits}, chunk_tiles={p.chunk_tiles}, min_tiles={p.min_tiles}, "
                f"variant={getattr(p, 'variant', 'v1')}")
        rows.append(_row(case, impl, kv, timing=t, chk=chk, note=note, **common))
        if assign and impl == "dynamic":
            ta = bench(lambda: K.assign_only(p), iters=iters, warmup=warmup)
            r = _row(case, "assign_only", kv, timing=ta, note="assign kernel alone (once per step)", **common)
            r.update(bytes=None, gbps=None, pct_of_ceiling=None, floor_us=None)
            rows.append(r)
    except Exception as e:
        rows.append(_row(case, impl, kv, note=f"failed: {type(e).__name__}: "
                         f"{str(e).splitlines()[0][:300] if str(e) else ''}", **common))
    return rows


def skew_lengths(total_tokens: int, long_fraction: float, batch: int = 32, align: int = 64) -> list[tuple[int, int]]:
    """A case with ``batch`` requests and exactly ``total_tokens`` tokens: one long request holding about
    long_fraction of them, the others equal (lengths multiples of ``align``). Returns [(count, length)].
    Raises ValueError when total_tokens is not a multiple of batch*align or long_fraction is outside
    [1/batch, 1)."""
    if batch < 2 or total_tokens <= 0 or total_tokens % (batch * align):
        raise ValueError(f"total_tokens: expected a positive multiple of batch*align = {batch * align}, "
                         f"got {total_tokens}")
    if not (1.0 / batch - 1e-9 <= long_fraction < 1.0):
        raise ValueError(f"long_fraction: expected in [1/batch, 1), got {long_fraction}")
    short = int(total_tokens * (1 - long_fraction) / (batch - 1)) // align * align
    short = max(align, min(short, total_tokens // batch))
    long = total_tokens - (batch - 1) * short
    return [(batch, short)] if long == short else [(1, long), (batch - 1, short)]


def skew_sweep_rows(total_tokens: int = 32 * 4096, *, batch: int = 32,
                    long_fractions=(1 / 32, 0.125, 0.25, 0.5, 0.75, 0.9),
                    impls=("dynamic", "static_count", "static_chunk"), kv_dtype="fp8", **kw) -> list[dict]:
    """Table ``decode_skew_sweep``: the same total KV bytes, one request taking a growing share.

    Extra columns: long_fraction (requested), long_share (actual), vs_uniform (median / the same impl's median at
    the uniform point; target for dynamic: <= 1.15). kw goes to decode_rows.
    """
    from hotpaths.harness.shapes import expand_lengths, format_case

    rows = []
    for f in long_fractions:
        case = format_case(skew_lengths(total_tokens, f, batch))
        lens = expand_lengths(case)
        for r in decode_rows([case], kv_dtypes=(kv_dtype,), impls=impls, assign=False, **kw):
            r.update(long_fraction=f, long_share=max(lens) / sum(lens))
            rows.append(r)
    base = {}
    for r in rows:
        if r["long_fraction"] == long_fractions[0] and r["median_us"]:
            base[r["impl"]] = r["median_us"]
    for r in rows:
        b = base.get(r["impl"])
        r["vs_uniform"] = (r["median_us"] / b) if (b and r["median_us"]) else None
    return rows


STAGE_CASES = ("64x0.5K", "64x4K", "1x128K+31x4K")


def overhead_rows(batches=(1, 8, 32, 64, 128, 256), *, kv_len: int = 4096, kv_heads: int = 1, q_heads: int = 8,
                  head_dim: int = 128, iters: int = 100, warmup: int = 10, num_ctas=None, min_tiles: int = DEFAULT_MIN_TILES,
                  stage_cases=STAGE_CASES) -> list[dict]:
    """Table ``decode_fixed_costs``: the assign kernel alone per batch size (target < 3 us up to 256 requests), the
    one-kernel timing floor, and for each of ``stage_cases`` (FP8 KV) the step (attention + combine) beside the
    attention kernel alone and the combine kernel alone (``run(..., stages=...)``), each timed the same way.
    Without SM90: rows with the reason and no timing.
    """
    import torch

    from hotpaths.harness.bench import bench, timing_floor
    from hotpaths.harness.shapes import format_case

    reason = kernel_unavailable_reason()
    device = _device_tag()
    rows = []
    for b in batches:
        case = format_case([(b, kv_len)])
        r = _row(case, "assign_only", "fp8", device=device, bytes_=None, kv_bytes=None, ceilings=None,
                 cfg=dict(q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim))
        r.update(published_dynamic_vs_static=None, hpc_ops_h200_us=None, dtype=None, batch=b)
        if reason:
            r["note"] = f"not timed: {reason}"
        else:
            from hotpaths.kernels import split_kv_decode as K

            try:
                lens = torch.full((b,), kv_len, dtype=torch.int32, device="cuda")
                p = K.plan(lens, num_kv_heads=kv_heads, q_heads=q_heads, head_dim=head_dim, num_ctas=num_ctas,
                           min_tiles=min_tiles, mode="dynamic")
                t = bench(lambda: K.assign_only(p), iters=iters, warmup=warmup)
                r.update(median_us=t.median_us, p10_us=t.p10_us, p90_us=t.p90_us, method=t.method,
                         note=f"num_ctas={p.num_ctas}; target < 3 us")
            except Exception as e:
                r["note"] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        rows.append(r)
    floor = timing_floor(1) if torch.cuda.is_available() else None
    rows.append(dict(op=OP, case="-", impl="timing_floor_1_kernel", device=device,
                     median_us=floor.median_us if floor else None, p10_us=floor.p10_us if floor else None,
                     p90_us=floor.p90_us if floor else None,
                     note="one trivial kernel, graph replay after an L2 flush" if floor else "needs a CUDA GPU"))
    for case in stage_cases:
        rows.extend(_stage_rows(case, reason, device=device, kv_heads=kv_heads, q_heads=q_heads, head_dim=head_dim,
                                iters=iters, warmup=warmup, num_ctas=num_ctas, min_tiles=min_tiles))
    return rows


def _stage_rows(case, reason, *, device, kv_heads, q_heads, head_dim, iters, warmup, num_ctas, min_tiles):
    """Rows step / attention_only / combine_only for one FP8 case (see overhead_rows)."""
    notes = {"all": "attention + combine (the per-layer time of decode_kv_distribution)",
             "attention": "attention kernel alone (run(stages='attention'))",
             "combine": "combine kernel alone on the partials of the previous launch (run(stages='combine'))"}
    names = {"all": "step", "attention": "attention_only", "combine": "combine_only"}
    rows = [dict(op=OP, case=case, impl=names[st], dtype=DTYPE_LABEL["fp8"], device=device, note=notes[st])
            for st in ("all", "attention", "combine")]
    if reason:
        for r in rows:
            r["note"] = f"not timed: {reason}"
        return rows
    import torch

    from hotpaths.harness.bench import bench
    from hotpaths.harness.shapes import expand_lengths, parse_cases
    from hotpaths.kernels import split_kv_decode as K
    from hotpaths.reference import split_kv_decode as R

    try:
        inp = R.make_decode_inputs(expand_lengths(parse_cases(case)), kv_dtype="fp8", q_heads=q_heads,
                                   kv_heads=kv_heads, head_dim=head_dim, device="cuda", seed=0)
        p = K.plan(inp["kv_lens"], num_kv_heads=kv_heads, q_heads=q_heads, head_dim=head_dim, num_ctas=num_ctas,
                   min_tiles=min_tiles, kv_dtype=inp["k_cache"].dtype)
        out = torch.empty_like(inp["q"], dtype=torch.bfloat16)
        a = (p, inp["q"], inp["k_cache"], inp["v_cache"], inp["block_table"], inp["kv_lens"])
        kw = dict(q_scale=inp["q_scale"], k_scale=inp["k_scale"], v_scale=inp["v_scale"], out=out, check_inputs=False)
        K.run(*a, **kw)
        for r, st in zip(rows, ("all", "attention", "combine")):
            if st == "combine" and p.fuse_max >= K.FUSE_ALL:
                r["note"] = (f"{r['note']}; not timed: no combine kernel (fuse-all: the attention kernel merges "
                             f"every pair); variant={p.variant}, num_ctas={p.num_ctas}")
                continue
            t = bench(lambda: K.run(*a, stages=st, **kw), iters=iters, warmup=warmup)
            r.update(median_us=t.median_us, p10_us=t.p10_us, p90_us=t.p90_us, method=t.method,
                     note=f"{r['note']}; variant={p.variant}, num_ctas={p.num_ctas}")
        del inp
    except Exception as e:
        for r in rows:
            r["note"] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
    return rows


# Child-process target for ncu: one warm-up + one profiled launch of the dynamic kernel on HOTPATHS_NCU_CASE.
_NCU_SNIPPET = """
import os, torch
from hotpaths.reference.split_kv_decode import make_decode_inputs
from hotpaths.harness.shapes import expand_lengths
from hotpaths.kernels import split_kv_decode as K
inp = make_decode_inputs(expand_lengths({case!r}), kv_dtype={kv!r}, device="cuda", q_heads={q_heads},
                         kv_heads={kv_heads}, head_dim={head_dim}, page_size={page_size})
p = K.plan(inp["kv_lens"], num_kv_heads={kv_heads}, q_heads={q_heads}, head_dim={head_dim}, mode="dynamic")
a = (p, inp["q"], inp["k_cache"], inp["v_cache"], inp["block_table"], inp["kv_lens"])
kw = dict(q_scale=inp["q_scale"], k_scale=inp["k_scale"], v_scale=inp["v_scale"])
for _ in range(2):
    K.run(*a, **kw)
torch.cuda.synchronize()
"""

NCU_METRICS = ("gpu__time_duration.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
               "sm__warps_active.avg.pct_of_peak_sustained_active", "dram__bytes_read.sum")


def ncu_rows(cases=NCU_CASES, *, kv_dtype="fp8", kernel_regex="attention_kernel", q_heads=8, kv_heads=1, head_dim=128,
             page_size=64, timeout_s: float = 300.0) -> list[dict]:
    """Table ``decode_ncu``: Nsight Compute of the dynamic attention kernel (second launch) per case.

    Columns: case, kernel, duration_us, dram_throughput_pct, achieved_occupancy_pct, dram_read_mb, note; raw
    per-case tables saved as profiles_dir()/decode_ncu_<case>.csv by hotpaths.harness.ncu. Where counters are not
    readable the row says "unavailable: <reason>" (never raises).
    """
    from hotpaths.harness import ncu

    device = _device_tag()
    rows = []
    for case in cases:
        snippet = _NCU_SNIPPET.format(case=case, kv=kv_dtype, q_heads=q_heads, kv_heads=kv_heads,
                                      head_dim=head_dim, page_size=page_size)
        safe = case.replace("+", "_").replace(".", "p")
        base = dict(op=OP, case=case, impl="dynamic", dtype=DTYPE_LABEL[kv_dtype], device=device)
        try:
            df = ncu.profile(snippet, kernel_regex=kernel_regex, metrics=NCU_METRICS,
                             out_csv=f"decode_ncu_{safe}", launch_skip=1, launch_count=1, timeout_s=timeout_s)
        except Exception as e:
            rows.append(dict(base, note=f"unavailable: {type(e).__name__}: {e}"))
            continue
        if ncu.is_unavailable(df):
            rows.append(dict(base, note=str(df["note"].iloc[0])))
            continue
        m = {r["metric"]: r["value"] for _, r in df.iterrows()}
        dur = m.get("gpu__time_duration.sum")
        rd = m.get("dram__bytes_read.sum")
        rows.append(dict(base, kernel=str(df["kernel"].iloc[0])[:80],
                         duration_us=dur / 1e3 if isinstance(dur, float) else None,
                         dram_throughput_pct=m.get("dram__throughput.avg.pct_of_peak_sustained_elapsed"),
                         achieved_occupancy_pct=m.get("sm__warps_active.avg.pct_of_peak_sustained_active"),
                         dram_read_mb=rd / 2**20 if isinstance(rd, float) else None,
                         # the full ncu command (with the profiled snippet) is in the .ncu.txt beside the CSV
                         note=f"ncu --clock-control none, metrics {', '.join(NCU_METRICS)}; profiles_dir/decode_ncu_{safe}.ncu.txt"))
    return rows


def stored_profile(name: str, device: str = "h200") -> tuple[dict, list[dict]]:
    """A committed JSON measurement of a decode script (data/profiles/<device>/<name>.json, written by
    scripts/gpu_decode_breakdown.py or scripts/gpu_ab_decode.py): (header fields, rows). Raises FileNotFoundError
    naming the expected path when it is missing."""
    import json

    from hotpaths.harness.env import REPO_ROOT

    path = REPO_ROOT / "data" / "profiles" / device / f"{name}.json"
    if not path.exists():
        raise FileNotFoundError(f"no stored profile {name!r} for device {device!r} (expected {path})")
    data = json.loads(path.read_text())
    rows = data.pop("rows", [])
    return data, rows
