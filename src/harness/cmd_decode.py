"""``hotpaths decode``: split-KV decode attention, correctness and (on SM90) latency per impl and case.

Rows come from hotpaths.harness.decode_bench.decode_rows, the same driver notebook 02 uses, so a table row's
``repro`` command reproduces it. On an SM90 GPU each impl is checked (output NaN-poisoned, vs the fp64 reference on
the same quantized inputs) and timed per layer (attention + combine; CUDA-graph replay, L2 flushed before each
replay), with GB/s and the fraction of the copy ceiling measured in the same run. Without one, our impls fall back
to the same-precision emulation (impl ``<impl>_emulation``, empty timing) and peers say why they did not run.
"""

from __future__ import annotations

KERNEL_IMPLS = ("dynamic", "static_count", "static_chunk", "batch_invariant")
ALIASES = {"static": ("static_count", "static_chunk")}
DEFAULT_IMPLS = "dynamic,static"


def register(subparsers) -> None:
    from hotpaths.harness.peers import PEER_NAMES
    from hotpaths.harness.shapes import case_list_arg, positive_int_arg
    from hotpaths.reference.split_kv_decode import DEFAULT_MIN_TILES

    p = subparsers.add_parser(
        "decode", help="split-KV decode attention over a paged KV cache: error and latency per impl",
        description="Runs each --impl on each case (AxB = A requests of KV length B, '+'-joined, K = 1024) with "
        "fresh random inputs (unused cache slots NaN-poisoned); reports rel L2 / max abs error / cosine vs the "
        "fp64 reference on the same quantized inputs and, on an SM90 GPU, median/p10/p90 us per layer, GB/s and "
        "% of the measured copy ceiling. Without SM90 our impls run as emulations (no timing).")
    p.add_argument("--cases", type=case_list_arg, default=["1x128K+31x4K"],
                   help="',' or ';'-separated cases (default 1x128K+31x4K)")
    p.add_argument("--kv-dtype", choices=("fp8", "bf16"), default="fp8", help="KV cache dtype (default fp8)")
    p.add_argument("--q-heads", type=int, default=8, help="query heads (default 8)")
    p.add_argument("--kv-heads", type=int, default=1, help="KV heads (default 1)")
    p.add_argument("--head-dim", type=int, default=128, help="head dim (default 128)")
    p.add_argument("--page-size", type=int, default=64, help="page size in tokens (default 64)")
    p.add_argument("--q-len", type=int, default=1, help="query tokens per request, 1-4 (MTP; default 1)")
    p.add_argument("--impl", default=DEFAULT_IMPLS,
                   help=f"comma-separated among {', '.join(KERNEL_IMPLS)}, static (= both static flavours), "
                   f"assign (the task-map kernel alone), {', '.join(PEER_NAMES)} (default {DEFAULT_IMPLS})")
    p.add_argument("--num-ctas", type=int, default=None, help="persistent CTAs (default: the kernel's default)")
    p.add_argument("--min-tiles", type=int, default=DEFAULT_MIN_TILES,
                   help=f"minimum-work floor in 64-token tiles (default {DEFAULT_MIN_TILES})")
    p.add_argument("--check", action="store_true", help="exit with status 1 if any row is outside its tolerance")
    p.add_argument("--iters", type=positive_int_arg("--iters"), default=100, help="timed replays per measurement (default 100)")
    p.add_argument("--seed", type=int, default=0, help="input seed (default 0)")
    p.add_argument("--json", action="store_true", help="one JSON row per line (tables.COLUMNS first)")
    p.add_argument("--save", default=None, metavar="NAME", help="also write NAME.csv/.md to the results dir")
    p.set_defaults(func=_run)


def parse_impls(spec: str) -> tuple[list[str], bool]:
    """``"dynamic,static,assign"`` -> (["dynamic", "static_count", "static_chunk"], assign=True).

    Raises ValueError naming unknown impls.
    """
    from hotpaths.harness.peers import PEER_NAMES

    impls, assign = [], False
    for name in (s.strip() for s in spec.split(",") if s.strip()):
        if name == "assign":
            assign = True
        elif name in ALIASES:
            impls += [i for i in ALIASES[name] if i not in impls]
        elif name in KERNEL_IMPLS or name in PEER_NAMES:
            if name not in impls:
                impls.append(name)
        else:
            raise ValueError(f"--impl: unknown {name!r}; choose among {', '.join(KERNEL_IMPLS + tuple(ALIASES) + ('assign',) + PEER_NAMES)}")
    if assign and "dynamic" not in impls:
        impls.insert(0, "dynamic")  # assign is timed on the dynamic plan
    return impls, assign


def _run(args) -> int:
    from hotpaths.harness import tables
    from hotpaths.harness.decode_bench import decode_rows

    impls, assign = parse_impls(args.impl)
    rows = decode_rows(args.cases, kv_dtypes=(args.kv_dtype,), impls=tuple(impls), q_heads=args.q_heads,
                       kv_heads=args.kv_heads, head_dim=args.head_dim, page_size=args.page_size, q_len=args.q_len,
                       iters=args.iters, seed=args.seed, num_ctas=args.num_ctas, min_tiles=args.min_tiles,
                       assign=assign, log=None)
    if args.save:
        tables.save(rows, args.save)
    if args.json:
        print(tables.json_lines(rows))
    else:
        _print_table(rows, args)
    failed = [r for r in rows if r.get("check_passed") is False]
    if args.check and failed:
        print(f"hotpaths decode: {len(failed)} row(s) outside tolerance: "
              + ", ".join(f"{r['case']}/{r['impl']}" for r in failed), file=__import__("sys").stderr)
        return 1
    return 0


def _print_table(rows, args) -> None:
    def f(v, spec):
        if v is None or v != v:
            return "-".rjust(int(spec.split(".")[0]))
        return format(v, spec)
    print(f"split_kv_decode kv={args.kv_dtype} q_heads={args.q_heads} kv_heads={args.kv_heads} d={args.head_dim} "
          f"page={args.page_size} q_len={args.q_len}")
    print(f"{'case':<20} {'impl':<26} {'median_us':>10} {'p10':>8} {'p90':>8} {'GB/s':>8} {'%ceil':>6} "
          f"{'rel_l2':>9} {'max_abs':>9}  note")
    for r in rows:
        print(f"{r['case']:<20} {r['impl']:<26} {f(r.get('median_us'), '10.2f')} {f(r.get('p10_us'), '8.2f')} "
              f"{f(r.get('p90_us'), '8.2f')} {f(r.get('gbps'), '8.0f')} {f(r.get('pct_of_ceiling'), '6.1f')} "
              f"{f(r.get('rel_l2_err'), '9.2e')} {f(r.get('max_abs_err'), '9.2e')}  {r.get('note') or ''}")
