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
from hotpaths.harness.shapes import positive_int_arg


def add_op_command(subparsers, name: str, *, func, help: str, description: str) -> argparse.ArgumentParser:
    """The subparser of one op's command with the options every op shares (--iters, --seed, --json, --save);
    the op's benchmark module adds its own. ``func(args) -> int`` runs it."""
    p = subparsers.add_parser(name, help=help, description=description)
    p.add_argument("--iters", type=positive_int_arg("--iters"), default=100,
                   help="timed replays per measurement (default 100)")
    p.add_argument("--seed", type=int, default=0, help="input seed (default 0)")
    p.add_argument("--json", action="store_true", help="one JSON row per line (tables.COLUMNS first)")
    p.add_argument("--save", default=None, metavar="NAME", help="also write the table NAME.csv/.md to the results dir")
    p.set_defaults(func=func)
    return p


def emit_rows(rows: list[dict], args, *, title: str | None = None) -> bool:
    """Save the rows when --save was given (``title`` heads the .md) and print them as JSON lines when --json was;
    True when printed."""
    if args.save:
        tables.save(rows, args.save, title=title)
    if args.json:
        print(tables.json_lines(rows))
    return bool(args.json)


def _cmd_env(args) -> int:
    info = env.device_info()
    info.update(env.build_info())
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


def _cmd_sass(args) -> int:
    from hotpaths.harness import sass
    from hotpaths.kernels import _build

    if args.op not in _build.all_ops():
        print(f"op: expected one of {', '.join(_build.all_ops())}, got {args.op!r}", file=sys.stderr)
        return 2
    try:
        m = sass.kernel_mix(args.op, args.kernel, loop=args.loop)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(m))
        return 0
    where = f"main loop {m['range'][0]}..{m['range'][1]}" if m["range"] else "whole function"
    print(f"{m['function']}\n{where}: {m['instructions']} instructions (static)")
    print("  by group:  " + ", ".join(f"{g} {n}" for g, n in m["groups"].items()))
    print("  by family: " + ", ".join(f"{f} {n}" for f, n in list(m["families"].items())[:24]))
    return 0


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

    e = sub.add_parser("env", help="device, versions, nvcc and measured ceilings",
                       description="Prints the device, library versions, the nvcc found (path, version) and whether "
                       "the sm_90a kernels can be built here and, on a GPU, the measured copy bandwidth, BF16/FP8 "
                       "matmul rates and the timing floor.")
    e.add_argument("--json", action="store_true", help="one JSON object")
    e.add_argument("--no-measure", action="store_true", help="skip the ceiling measurements")
    e.set_defaults(func=_cmd_env)

    s = sub.add_parser("sass", help="static SASS instruction mix of one built kernel (no GPU needed)",
                       description="Builds the op's library if needed, disassembles it with cuobjdump and prints "
                       "the instruction mix of the kernel matching --kernel (a regex on the mangled name), or of "
                       "its main loop (the loop with the most tensor-core instructions): static counts, each "
                       "instruction of the range once.")
    s.add_argument("op", help="the op whose library holds the kernel (e.g. split_kv_decode)")
    s.add_argument("--kernel", required=True, help="regex on the mangled kernel name, e.g. 'TraitsWgILi3ELi2'")
    s.add_argument("--loop", action="store_true", help="the main loop only")
    s.add_argument("--json", action="store_true", help="one JSON object")
    s.set_defaults(func=_cmd_sass)

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
    for sp in sub.choices.values():  # every command: no progress bars (they are off anyway when not a terminal)
        if "--quiet" not in sp._option_string_actions:
            sp.add_argument("--quiet", action="store_true", help="no progress bars on stderr")
    return p


def _join_dash_values(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``--cases -1x5`` -> ``--cases=-1x5``: argparse takes a value that starts with '-' (and is not a plain
    negative number) for an option and says "expected one argument"; joined, the value reaches the option's own
    check, which names the bad term."""
    takes_value = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sp in action.choices.values():
                takes_value |= {s for a in sp._actions if a.nargs is None and a.option_strings
                                and not isinstance(a, (argparse._StoreTrueAction, argparse._StoreFalseAction,
                                                       argparse._HelpAction))
                                for s in a.option_strings}
    known = {s for a in parser._actions for s in a.option_strings}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sp in action.choices.values():
                known |= {s for a in sp._actions for s in a.option_strings}
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        if a in takes_value and i + 1 < len(argv) and argv[i + 1].startswith("-") and argv[i + 1] not in known \
                and argv[i + 1] != "--":
            out.append(f"{a}={argv[i + 1]}")
            i += 2
            continue
        out.append(a)
        i += 1
    return out


def _parse(parser: argparse.ArgumentParser, argv: list[str]):
    """parse_args, except that an unknown option is reported by the subcommand's parser (its usage, not the top
    one's)."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        sub.choices[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _quiet_broken_pipe() -> int:
    """The reader went away (``hotpaths ... | head``): like other Unix tools, stop quietly. Python would report
    the pipe again while flushing stdout at exit, so stdout is pointed at /dev/null first."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = _join_dash_values(parser, list(sys.argv[1:] if argv is None else argv))
    args = _parse(parser, argv)
    from hotpaths.harness import progress

    progress.QUIET = bool(getattr(args, "quiet", False))
    try:
        rc = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows up here for short outputs
        return rc
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except (ValueError, TypeError) as exc:  # bad input that passed argparse (sizes that do not fit included)
        print(f"hotpaths {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:  # e.g. a GPU-only action on a machine without one
        print(f"hotpaths {args.command}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
