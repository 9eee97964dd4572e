"""``hotpaths decode``: split-KV decode attention, correctness and (on SM90) latency per impl and case.

On an SM90 GPU each kernel impl (dynamic, static_count, static_chunk, batch_invariant) runs and is timed per layer
(attention + combine; CUDA-graph replay, L2 flushed before each replay, median of --iters), with GB/s (bytes =
KV read once + Q + out) and the fraction of the copy ceiling measured in the same run; ``assign`` times the
device task-map build alone. Without one, every kernel impl falls back to the same-precision emulation in PyTorch
(impl column ``<impl>_emulation``, timing columns empty), so the correctness half is still produced.
``reference`` is the exact fp32 reference (correctness only).
"""

from __future__ import annotations

import argparse

KERNEL_IMPLS = ("dynamic", "static_count", "static_chunk", "batch_invariant")
DEFAULT_IMPLS = "dynamic,static_count,static_chunk"


def register(subparsers) -> None:
    from hotpaths.harness.shapes import case_list_arg

    p = subparsers.add_parser(
        "decode", help="split-KV decode attention over a paged KV cache: error and latency per impl",
        description="Runs each --impl on each case (AxB = A requests of KV length B, '+'-joined, K = 1024) with "
        "fresh random inputs (unused cache slots NaN-poisoned); reports rel L2 / max abs error vs the fp32 "
        "reference on the same quantized inputs and, on an SM90 GPU, median/p10/p90 us per layer, GB/s and % of "
        "the measured copy ceiling. Without SM90 the kernel impls run as emulations (no timing).")
    p.add_argument("--cases", type=case_list_arg, default=["1x128K+31x4K"],
                   help="';'-separated cases (default 1x128K+31x4K)")
    p.add_argument("--kv-dtype", choices=("fp8", "bf16"), default="fp8", help="KV cache dtype (default fp8)")
    p.add_argument("--q-heads", type=int, default=8, help="query heads (default 8)")
    p.add_argument("--kv-heads", type=int, default=1, help="KV heads (default 1)")
    p.add_argument("--head-dim", type=int, default=128, help="head dim (default 128)")
    p.add_argument("--page-size", type=int, default=64, help="page size in tokens (default 64)")
    p.add_argument("--q-len", type=int, default=1, help="query tokens per request, 1-4 (MTP; default 1)")
    p.add_argument("--impl", default=DEFAULT_IMPLS,
                   help=f"comma-separated among {', '.join(KERNEL_IMPLS)}, assign, reference (default {DEFAULT_IMPLS})")
    p.add_argument("--num-ctas", type=int, default=None, help="persistent CTAs (default: SM count)")
    p.add_argument("--check", action="store_true", help="compute the error columns (vs the fp32 reference)")
    p.add_argument("--iters", type=int, default=100, help="timed replays per measurement (default 100)")
    p.add_argument("--seed", type=int, default=0, help="input seed (default 0)")
    p.add_argument("--json", action="store_true", help="one JSON row per line (tables.COLUMNS first)")
    p.add_argument("--save", default=None, metavar="NAME", help="also write NAME.csv/.md to the results dir")
    p.set_defaults(func=_run)


def decode_rows(cases, impls, *, kv_dtype="fp8", q_heads=8, kv_heads=1, head_dim=128, page_size=64, q_len=1,
                num_ctas=None, check=False, iters=100, seed=0, ceilings=None) -> list[dict]:
    """One row per (case, impl) with tables.COLUMNS (+ mode-specific columns num_ctas, splits).

    Raises ValueError for an unknown impl or an unsupported configuration.
    """
    import torch

    from hotpaths.harness import env, runs, shapes
    from hotpaths.harness.check import check as check_fn
    from hotpaths.reference import split_kv_decode as R

    unknown = [i for i in impls if i not in KERNEL_IMPLS + ("assign", "reference")]
    if unknown:
        raise ValueError(f"--impl: unknown {unknown}; choose among {KERNEL_IMPLS + ('assign', 'reference')}")
    gpu = env.has_sm90()
    dev = "cuda" if gpu else "cpu"
    if gpu and ceilings is None:
        from hotpaths.harness import ceilings as C

        ceilings = C.measure()
    rows = []
    for case in cases:
        lens = shapes.expand_lengths(shapes.parse_cases(case))
        inp = R.make_decode_inputs(lens, q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim,
                                   page_size=page_size, q_len=q_len, kv_dtype=kv_dtype, device=dev, seed=seed)
        nbytes = R.bytes_moved(lens, kv_heads, head_dim, kv_dtype, q_heads, q_len)
        ref = R.split_kv_decode_ref(**inp) if (check or "reference" in impls) else None
        for impl in impls:
            row = dict(op="split_kv_decode", case=case, impl=impl, dtype=kv_dtype, device=env.device_tag(),
                       bytes=nbytes, run_id=runs.run_id(),
                       repro=f"hotpaths decode --cases '{case}' --kv-dtype {kv_dtype} --q-heads {q_heads} "
                             f"--kv-heads {kv_heads} --head-dim {head_dim} --page-size {page_size} --q-len {q_len} "
                             f"--impl {impl}" + (" --check" if check else ""))
            out = None
            if impl == "reference":
                out = ref
            elif not gpu:
                row["impl"] = f"{impl}_emulation"
                if impl == "assign":
                    rows.append(row)
                    continue
                out = _emulate(inp, impl, kv_heads, num_ctas or 264)  # H200: 132 SMs x 2 CTAs
            else:
                out = _gpu_impl(inp, impl, num_ctas, iters, row, ceilings, nbytes)
            if out is not None and check and ref is not None:
                row.update(check_fn(out, ref, op="split_kv_decode", path=f"{kv_dtype}_vs_exact").as_row())
            rows.append(row)
    return rows


def _emulate(inp, impl, H, C):
    import torch

    from hotpaths.reference import split_kv_decode as R

    lens = inp["kv_lens"].tolist()
    if impl == "dynamic":
        tm = R.build_task_map(lens, H, C)
    elif impl == "static_count":
        tm = R.static_count_task_map(lens, H, max(1, -(-C // (len(lens) * H))))
    else:
        tm = R.static_chunk_task_map(lens, H, 16)
    p_dtype = torch.float16 if inp["k_cache"].dtype != torch.bfloat16 else torch.bfloat16
    return R.split_kv_decode_emulation(**inp, task_map=tm, p_dtype=p_dtype)


def _gpu_impl(inp, impl, num_ctas, iters, row, ceilings, nbytes):
    import torch

    from hotpaths.harness.bench import bench
    from hotpaths.harness.ceilings import pct_of_ceiling
    from hotpaths.kernels import split_kv_decode as K

    q, kc = inp["q"], inp["k_cache"]
    mode = "dynamic" if impl == "assign" else impl
    p = K.plan(inp["kv_lens"], num_kv_heads=kc.shape[2], q_heads=q.shape[1], head_dim=kc.shape[3],
               num_ctas=num_ctas, mode=mode, q_len=inp["q_len"])
    row["num_ctas"], row["splits"] = p.num_ctas, p.splits
    out = torch.full(q.shape, float("nan"), dtype=torch.bfloat16, device="cuda")
    args = (q, kc, inp["v_cache"], inp["block_table"], inp["kv_lens"])
    kw = dict(q_scale=inp["q_scale"], k_scale=inp["k_scale"], v_scale=inp["v_scale"], q_len=inp["q_len"], out=out)
    K.run(p, *args, **kw)  # full input validation once, outside the timed graph
    torch.cuda.synchronize()
    if impl == "assign":
        t = bench(lambda: K.assign_only(p), cold_l2=True, iters=iters)
        row.update(median_us=t.median_us, p10_us=t.p10_us, p90_us=t.p90_us, bytes=None)
        return None
    t = bench(lambda: K.run(p, *args, **kw, check_inputs=False), cold_l2=True, iters=iters)
    gbps = nbytes / t.median_us / 1e3
    row.update(median_us=t.median_us, p10_us=t.p10_us, p90_us=t.p90_us, gbps=gbps,
               pct_of_ceiling=pct_of_ceiling(gbps, ceilings))
    return out


def _run(args) -> int:
    from hotpaths.harness import tables

    impls = [i.strip() for i in args.impl.split(",") if i.strip()]
    try:
        rows = decode_rows(args.cases, impls, kv_dtype=args.kv_dtype, q_heads=args.q_heads, kv_heads=args.kv_heads,
                           head_dim=args.head_dim, page_size=args.page_size, q_len=args.q_len,
                           num_ctas=args.num_ctas, check=args.check, iters=args.iters, seed=args.seed)
    except ValueError as e:
        raise SystemExit(f"hotpaths decode: {e}")
    if args.save:
        tables.save(rows, args.save)
    if args.json:
        print(tables.json_lines(rows))
        return 0

    def f(v, spec):
        if v is None or v != v:
            return "-".rjust(int(spec.split(".")[0]))
        return format(v, spec)
    print(f"split_kv_decode kv={args.kv_dtype} q_heads={args.q_heads} kv_heads={args.kv_heads} d={args.head_dim} "
          f"page={args.page_size} q_len={args.q_len}")
    print(f"{'case':<20} {'impl':<26} {'median_us':>10} {'p10':>8} {'p90':>8} {'GB/s':>8} {'%ceil':>6} "
          f"{'rel_l2':>9} {'max_abs':>9}")
    for r in rows:
        print(f"{r['case']:<20} {r['impl']:<26} {f(r.get('median_us'), '10.2f')} {f(r.get('p10_us'), '8.2f')} "
              f"{f(r.get('p90_us'), '8.2f')} {f(r.get('gbps'), '8.0f')} {f(r.get('pct_of_ceiling'), '6.1f')} "
              f"{f(r.get('rel_l2_err'), '9.2e')} {f(r.get('max_abs_err'), '9.2e')}")
    return 0
