"""``hotpaths fuzz``: random configurations of each op vs its reference, outputs poisoned and every buffer guarded.

The per-op generators and runners live in ``hotpaths.bench.<op>_fuzz`` (``fuzz_case``, ``fuzz_run``,
``SANITIZE_CASES``); this module is the driver and the command. On an SM90 GPU the kernels run; elsewhere the
emulations run against the exact references (the ``path`` column says which).

``python -m hotpaths.bench.fuzz --sanitize-case OP`` runs the op's fixed SANITIZE_CASES once each, eagerly (no
CUDA graphs), for compute-sanitizer (tools/gpu/sanitize.sh); it exits 1 if a case fails its checks.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

from hotpaths.bench import OPS
from hotpaths.harness import fuzzing, tables

FUZZ_OPS = OPS


def fuzz_module(op: str):
    """The op's fuzz module ``hotpaths.bench.<op>_fuzz``. Raises ValueError naming --op for an unknown op."""
    if op not in FUZZ_OPS:
        raise ValueError(f"--op: expected one of {', '.join(FUZZ_OPS)}, got {op!r}")
    return importlib.import_module(f"hotpaths.bench.{op}_fuzz")


def on_kernel() -> bool:
    """True when the SM90 kernels can run here (configurations are then drawn with kernel=True)."""
    from hotpaths.reference.common import sm90_skip_reason

    return sm90_skip_reason() is None


def run_fuzz(op: str, *, n: int, seed: int, config: str | None = None, save: bool = True, out_dir=None,
             progress=None) -> list[dict]:
    """n drawn cases (or the one --config JSON case) of op; saves the table fuzz_<op> when save (in out_dir, default
    hotpaths.harness.runs.results_dir())."""
    mod = fuzz_module(op)
    if config is not None:
        cfg = json.loads(config)
        rows = fuzzing.sweep(op, lambda draw, kernel: cfg, mod.fuzz_run, n=1, seed=seed, kernel=on_kernel(),
                             progress=progress)
    else:
        rows = fuzzing.sweep(op, mod.fuzz_case, mod.fuzz_run, n=n, seed=seed, kernel=on_kernel(),
                             progress=progress)
    if save:
        where = "kernel" if on_kernel() else "CPU emulation"
        tables.save(rows, f"fuzz_{op}", out_dir=out_dir, title=f"fuzz {op}: {len(rows)} configurations, seed {seed}, "
                    f"{sum(r['status'] != 'ok' for r in rows)} failures ({where})")
    return rows


def _cmd(args) -> int:
    ops = FUZZ_OPS if args.op == "all" else [args.op]
    all_rows = []
    for op in ops:
        reason = getattr(fuzz_module(op), "unavailable_reason", lambda: None)()
        if reason:
            print(f"fuzz {op}: skipped: {reason}", file=sys.stderr)
            if args.op != "all":
                return 1
            continue
        save = args.config is None and not args.no_save
        rows = run_fuzz(op, n=args.n, seed=args.seed, config=args.config, save=save, out_dir=args.out_dir,
                        progress=None if args.json else (lambda s: print(s, file=sys.stderr)))
        all_rows += rows
    if args.json:
        print(tables.json_lines(all_rows))
    for s in fuzzing.summary(all_rows).values():
        print(f"fuzz {s['op']}: {s['tried']} configurations, {s['failed']} failures "
              f"({'kernel' if on_kernel() else 'CPU emulation vs exact'})", file=sys.stderr)
    return 1 if any(r["status"] != "ok" for r in all_rows) else 0


def register(subparsers) -> None:
    """Add ``hotpaths fuzz`` to the CLI's subparsers."""
    p = subparsers.add_parser(
        "fuzz", help="random configurations vs the reference, guarded and poisoned buffers",
        description="Draws --n configurations of --op from the supported space (seeded), runs each (SM90: the "
        "kernel on buffers with canary guards before and after every output, workspace and cache, outputs "
        "poisoned; checks the guards, untouched slots and the result vs the emulation; elsewhere: the emulations "
        "vs the exact references) and writes the table fuzz_<op> (status, failures, the repro command of each "
        "failure). --config JSON re-runs one case (the repro). Exit 1 if any case failed.")
    p.add_argument("--op", choices=FUZZ_OPS + ("all",), required=True, help="op slug, or all")
    p.add_argument("--n", type=int, default=50, help="configurations per op (default 50)")
    p.add_argument("--seed", type=int, default=0, help="sweep seed (default 0)")
    p.add_argument("--config", default=None, help="one configuration as JSON (a failure's repro); not saved")
    p.add_argument("--no-save", action="store_true", help="do not write the fuzz_<op> table")
    p.add_argument("--out-dir", default=None, help="folder of the fuzz_<op> table (default: the results dir, "
                   "scratch/results/<device>/ outside `hotpaths reproduce`; data/results/<device> to commit it)")
    p.add_argument("--json", action="store_true", help="one JSON row per line")
    p.set_defaults(func=_cmd)


def sanitize_case(op: str) -> int:
    """Run op's SANITIZE_CASES once each (eager launches); print one line per case; 1 if any failed its checks."""
    mod = fuzz_module(op)
    if not on_kernel():
        print(f"sanitize {op}: no SM90 GPU; nothing launched", file=sys.stderr)
        return 2
    reason = getattr(mod, "unavailable_reason", lambda: None)()
    if reason:
        print(f"sanitize {op}: skipped: {reason}", flush=True)
        return 2
    fuzzing.REF_DEVICE = "cpu"  # only the op's launches (and a few copies) run instrumented
    bad = 0
    for i, cfg in enumerate(mod.SANITIZE_CASES):
        print(f"{fuzzing.CASE_MARK} {op} {i}", flush=True)
        try:
            res = mod.fuzz_run(cfg)
        except Exception as exc:  # noqa: BLE001 - reported per case; the next case still runs
            res = {"failures": [f"{type(exc).__name__}: {exc}"]}
        fails = res.get("failures", [])
        bad += bool(fails)
        print(f"sanitize {op} case {i}: {'ok' if not fails else 'FAIL: ' + '; '.join(fails)}", flush=True)
    return 1 if bad else 0


def sanitizer_table(log_dir: str, *, device: str | None = None) -> list[dict]:
    """Rows (tool, op, case, errors, library_reports, ...) from the logs <tool>__<op>.log that tools/gpu/sanitize.sh
    wrote: one row per case (reports attributed by the case markers) and one per (tool, op) with the tool's summary
    total. ``errors`` counts reports in our kernels (the summary less the reports in library kernels: PyTorch's
    reductions and copies that the driver's checks launch, counted in ``library_reports`` and named in
    ``first_library_report``); a run without a summary (the tool refused or the process died) is a row saying so
    with the log's last line."""
    from pathlib import Path

    rows = []
    for log in sorted(Path(log_dir).glob("*__*.log")):
        tool, op = log.stem.split("__", 1)
        text = log.read_text(errors="replace")
        r = fuzzing.parse_sanitizer_log(text)
        n_cases = len(fuzz_module(op).SANITIZE_CASES)
        for i in range(n_cases):
            rows.append({"op": op, "tool": tool, "case": str(i), "device": device,
                         "errors": r["per_case"].get(i) if i in r["per_case"] else None,
                         "library_reports": r["per_case_library"].get(i),
                         "checks": r["case_status"].get(i, "not reached"),
                         "config": fuzzing.config_json(fuzz_module(op).SANITIZE_CASES[i])})
        tail = [ln for ln in text.splitlines() if ln.strip()][-1:] or [""]
        ours = None if r["summary"] is None else max(r["summary"] - r["library"], 0)
        rows.append({"op": op, "tool": tool, "case": "all", "device": device, "errors": ours,
                     "library_reports": r["library"],
                     "checks": "" if r["summary"] is not None else f"no summary (tool refused or died): "
                     f"{tail[0][:200]}", "first_report": r["first"],
                     "first_library_report": r["first_library"][:200]})
    return rows


def main(argv=None) -> int:
    """``python -m hotpaths.bench.fuzz``: the sanitizer entry points (one op's fixed edge launches, or the
    sanitizer table from a log folder); the exit status."""
    p = argparse.ArgumentParser(prog="python -m hotpaths.bench.fuzz")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--sanitize-case", choices=FUZZ_OPS, help="run the op's fixed edge launches (for compute-sanitizer)")
    g.add_argument("--sanitize-table", metavar="LOG_DIR", help="write the sanitizer table from the logs in LOG_DIR")
    p.add_argument("--case", type=int, default=None, help="only this case index")
    p.add_argument("--out-dir", default=None, help="folder of the sanitizer table (default: the results dir)")
    args = p.parse_args(argv)
    if args.sanitize_table:
        from hotpaths.harness import env

        rows = sanitizer_table(args.sanitize_table, device=env.device_info().get("device"))
        if not rows:
            print(f"no <tool>__<op>.log files in {args.sanitize_table}", file=sys.stderr)
            return 2
        paths = tables.save(rows, "sanitizer", out_dir=args.out_dir,
                            title="compute-sanitizer over each kernel family (edge cases)")
        print(tables.to_markdown(tables.normalize(rows)))
        print(f"wrote {paths[0]} and {paths[1]}", file=sys.stderr)
        total = [r["errors"] for r in rows if r["case"] == "all"]
        return 0 if all(e == 0 for e in total) else 1
    if args.case is not None:
        mod = fuzz_module(args.sanitize_case)
        mod.SANITIZE_CASES[:] = [mod.SANITIZE_CASES[args.case]]
    return sanitize_case(args.sanitize_case)


if __name__ == "__main__":
    sys.exit(main())
