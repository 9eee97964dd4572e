"""``hotpaths router``: router GEMM (two-part BF16 weight) latency and error over an M sweep.

On an SM90 GPU every impl is run and timed (CUDA-graph replay, L2 flushed before each replay); without one, the
kernel and cuBLAS impls fall back to their same-precision emulations (impl column ``*_emulation``, no timing), so
the correctness half of the table is still produced.
"""

from __future__ import annotations

DEFAULT_IMPLS = "bf16x2_kernel,dispatch,fp32_cublas,tf32_cublas,bf16_cublas"


def register(subparsers) -> None:
    from hotpaths.harness.shapes import int_list_arg, positive_int_arg

    p = subparsers.add_parser(
        "router", help="router GEMM with a two-part BF16 weight: latency and error by M",
        description="Scores x @ W.T, x BF16 [M, K], W FP32 [N, K] split into BF16 parts (W ~ W_high + W_low/256). "
        "Runs each --impl at each M on fresh random inputs; reports median/p10/p90 us (GPU), speedups vs FP32 and "
        "TF32 cuBLAS, and max abs / rel L2 error vs FP64 and FP32. Without an SM90 GPU the emulations run instead "
        "(no timing).")
    p.add_argument("--m", type=int_list_arg("--m", minimum=1), default=[1, 2, 4, 8, 16, 48, 96, 208, 512, 1024, 2048, 4096],
                   help="comma-separated token counts M (default: the Hy3 sweep 1,2,...,4096)")
    p.add_argument("--n", type=int, default=192, help="number of experts N, a multiple of 64 (default 192)")
    p.add_argument("--k", type=int, default=4096, help="hidden size K, a multiple of 64 (default 4096)")
    p.add_argument("--impl", default=DEFAULT_IMPLS,
                   help=f"comma-separated impls among dispatch, bf16x2_kernel, bf16x3_kernel, fp32_cublas, "
                   f"tf32_cublas, bf16_cublas (default {DEFAULT_IMPLS})")
    p.add_argument("--case-prefix", default="hy3", help="prefix of the case column (default hy3)")
    p.add_argument("--seed", type=int, default=0, help="input seed (default 0)")
    p.add_argument("--iters", type=positive_int_arg("--iters"), default=100, help="timed replays per measurement (default 100)")
    p.add_argument("--json", action="store_true", help="one JSON row per line (tables.COLUMNS first)")
    p.add_argument("--save", default=None, metavar="NAME", help="also write the table NAME.csv/.md to the results dir")
    p.add_argument("--tune", action="store_true",
                   help="SM90 only: tune the kernel configurations and measure the dispatch crossover for every "
                   "router shape (Hy3, LongCat Chat/Lite, DeepSeek-V3) at the M sweep, writing "
                   "data/dispatch/router_gemm_<device>.json (what `dispatch` reads), then exit")
    p.set_defaults(func=_run)


def _run(args) -> int:
    from hotpaths.harness import tables
    from hotpaths.kernels.router_gemm import benchmark_rows

    if args.tune:
        return _tune(args)
    impls = [i.strip() for i in args.impl.split(",") if i.strip()]
    rows = benchmark_rows(args.m, args.n, args.k, impls, case_prefix=args.case_prefix, seed=args.seed,
                          iters=args.iters)
    if args.save:
        tables.save(rows, args.save)
    if args.json:
        print(tables.json_lines(rows))
        return 0
    head = f"{'m':>6} {'impl':<18} {'median_us':>10} {'vs_fp32':>8} {'vs_tf32':>8} {'maxabs_fp64':>12} " \
           f"{'maxabs_fp32':>12} {'flips':>6}"
    print(f"router_gemm N={args.n} K={args.k} device={rows[0]['device'] if rows else '?'}")
    print(head)

    def f(v, fmt):
        return format(v, fmt) if v is not None else "-".rjust(int(fmt[1:].split(".")[0].rstrip("d") or 1))
    for r in rows:
        print(f"{r['m']:>6} {r['impl']:<18} {f(r['median_us'], '>10.2f')} {f(r['speedup_vs_fp32'], '>8.2f')} "
              f"{f(r['speedup_vs_tf32'], '>8.2f')} {r['max_abs_err_vs_fp64']:>12.3e} {r['max_abs_err_vs_fp32']:>12.3e} "
              f"{f(r['topk_flips'], '>6d')}")
    return 0


def _tune(args) -> int:
    from hotpaths.kernels import router_gemm as rg
    from hotpaths.reference.router_gemm import SHAPES

    table = rg.measure_crossover(list(SHAPES.values()), args.m, iters=min(args.iters, 30), seed=args.seed)
    for s in table["shapes"]:
        print(f"N={s['n']} K={s['k']}  M: kernel us / fp32 cuBLAS us  choice  config")
        for r in s["rows"]:
            print(f"  {r['m']:>5}: {r['bf16x2_kernel_us']:8.2f} / {r['fp32_cublas_us']:8.2f}  {r['choice']:<14} "
                  f"{r['kernel']['variant']}/{r['kernel']['splits']}" + (f"  ({len(r['failed'])} candidates failed)"
                                                                         if r.get("failed") else ""))
    print(f"wrote {rg.dispatch_path()}")
    return 0
