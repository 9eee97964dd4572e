"""The ``hotpaths`` command-line tool: ``reproduce``, ``env``, and one subcommand per op.

Op subcommands live in each op's benchmark module (``hotpaths.bench.<op>.register(subparsers)``), imported by name
from ``hotpaths.bench.OPS`` so this module has no import edge to any op.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

from hotpaths.bench import COMMANDS, OPS
from hotpaths.harness import bench, ceilings, env, tables
from hotpaths.harness.reproduce import reproduce


def add_op_command(subparsers, name: str, *, func, help: str, description: str) -> argparse.ArgumentParser:
    """The subparser of one op's command with the options every op shares (--iters, --seed, --json, --save);
    the op's benchmark module adds its own. ``func(args) -> int`` runs it."""
    p = subparsers.add_parser(name, help=help, description=description)
    p.add_argument("--iters", type=int, default=100, help="timed replays per measurement (default 100)")
    p.add_argument("--seed", type=int, default=0, help="input seed (default 0)")
    p.add_argument("--json", action="store_true", help="one JSON row per line (tables.COLUMNS first)")
    p.add_argument("--save", default=None, metavar="NAME", help="also write the table NAME.csv/.md to the results dir")
    p.set_defaults(func=func)
    return p


def emit_rows(rows: list[dict], args) -> bool:
    """Save the rows when --save was given and print them as JSON lines when --json was; True when printed."""
    if args.save:
        tables.save(rows, args.save)
    if args.json:
        print(tables.json_lines(rows))
    return bool(args.json)


def _cmd_env(args) -> int:
    info = env.device_info()
    if env.has_cuda() and not args.no_measure:
        info["ceilings"] = ceilings.measure()
        floors = {f"floor_{n}_kernels_us": bench.timing_floor(n).median_us for n in (1, 3)}
        info["timing_floor"] = floors
    else:
        info["ceilings"] = "not measured (no CUDA device)" if not env.has_cuda() else "skipped (--no-measure)"
    if args.json:
        print(json.dumps(info, default=str))
    else:
        width = max(map(len, info))
        for k, v in info.items():
            print(f"{k:<{width}}  {v}")
    return 0


def _cmd_reproduce(args) -> int:
    return reproduce(profile=args.profile, only=args.only, device=args.device, dry_run=args.dry_run)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hotpaths", description=(
        "Reference and SM90 kernels for MoE serving hot paths: re-run the notebooks, inspect the device, run one "
        "op. Case strings follow the articles: AxB = A requests of KV length B, joined with '+', K = 1024 "
        "(e.g. 1x128K+31x4K)."))
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    r = sub.add_parser("reproduce", help="re-execute the notebooks with papermill and regenerate the tables",
                       description="Runs every notebook (or --only) through papermill with the profile's parameter "
                       "file papermill_runs/params/<nb>.<profile>.yaml; executed copies go to "
                       "papermill_runs/<device-tag>/ with manifest.json, tables to data/results/<device-tag>/. "
                       "A failing notebook fails the command and leaves the previous tables untouched.")
    r.add_argument("--profile", choices=("quick", "full"), default="quick", help="parameter profile (default quick)")
    r.add_argument("--only", default=None, help="comma-separated notebook numbers, e.g. 00,04")
    r.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: the GPU if there is one; cpu: hide GPUs from the notebooks")
    r.add_argument("--dry-run", action="store_true", help="list what would run and exit")
    r.set_defaults(func=_cmd_reproduce)

    e = sub.add_parser("env", help="device, versions and measured ceilings",
                       description="Prints the device, library versions and, on a GPU, the measured copy bandwidth, "
                       "BF16/FP8 matmul rates and the timing floor.")
    e.add_argument("--json", action="store_true", help="one JSON object")
    e.add_argument("--no-measure", action="store_true", help="skip the ceiling measurements")
    e.set_defaults(func=_cmd_env)

    # Op subcommands: each op's benchmark module registers its own (hotpaths.bench.<op>.register); imported by
    # name so the generic harness has no import edge to any op.
    # Extra commands (hotpaths.bench.COMMANDS, e.g. fuzz) register the same way.
    for modname in [f"hotpaths.bench.{name}" for name in OPS + COMMANDS]:
        try:
            mod = importlib.import_module(modname)
        except ModuleNotFoundError as exc:  # an op not built yet in this checkout
            if exc.name != modname:
                raise
            continue
        if hasattr(mod, "register"):
            mod.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, TypeError) as exc:  # bad input that passed argparse: a clear message, exit 2
        print(f"hotpaths {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:  # e.g. a GPU-only action on a machine without one
        print(f"hotpaths {args.command}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
