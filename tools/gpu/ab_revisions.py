"""Before/after A/B of the kernels of two source trees in one GPU run (the refactor check: no kernel slower).

Each tree is an exported ``src/`` (e.g. ``git archive <rev> src | tar -x -C .carry/base``) imported as ``hotpaths``
through a link, and timed by its own CLI in a subprocess (``hotpaths decode ... --json`` and ``hotpaths router ...
--json``), alternating A, B, A, B so clock drift hits both alike. Writes a long-format CSV (tree, round, op, case,
impl, median_us) and a Markdown summary of the per-row medians over rounds with the ratio after/before.

    python3 tools/gpu/ab_revisions.py --before .carry/base/src --after src --out $OUT/ab --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

DECODE_CASES = "64x0.5K,64x4K,32x0.125K+32x4K,2x32K+30x4K,1x64K+15x4K,1x128K+31x4K,1x16K+15x64,1x64K+7x4K,1x64K+31x4K"
ROUTER_M = "1,2,4,8,16,48,96,208,512,1024,2048,4096"


def _commands(iters: int) -> list[tuple[str, list[str]]]:
    return [
        ("decode_fp8", ["decode", "--cases", DECODE_CASES, "--kv-dtype", "fp8", "--impl", "dynamic", "--json",
                        "--iters", str(iters)]),
        ("decode_bf16", ["decode", "--cases", DECODE_CASES, "--kv-dtype", "bf16", "--impl", "dynamic", "--json",
                         "--iters", str(iters)]),
        ("router", ["router", "--m", ROUTER_M, "--impl", "dispatch", "--json", "--iters", str(iters)]),
    ]


def _run_tree(src: Path, args: list[str], build_dir: Path) -> list[dict]:
    link_root = Path(tempfile.mkdtemp(prefix="ab_"))
    (link_root / "hotpaths").symlink_to(src.resolve())
    env = dict(os.environ, PYTHONPATH=f"{link_root}:{os.environ.get('PYTHONPATH', '')}",
               HOTPATHS_BUILD_DIR=str(build_dir))
    proc = subprocess.run([sys.executable, "-m", "hotpaths", *args], capture_output=True, text=True, env=env,
                          cwd=link_root)
    if proc.returncode != 0:
        print(f"[ab] {src} {' '.join(args[:1])} failed ({proc.returncode}):\n{proc.stderr[-3000:]}", flush=True)
        return []
    rows = []
    for line in proc.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            rows.append(json.loads(line))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True, help="src/ of the reference tree")
    ap.add_argument("--after", type=Path, required=True, help="src/ of the changed tree")
    ap.add_argument("--out", type=Path, required=True, help="output stem (writes <out>.csv and <out>.md)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--only", default="", help="comma-separated subset of decode_fp8,decode_bf16,router")
    a = ap.parse_args(argv)
    if a.rounds < 1 or a.iters < 1:
        ap.error("--rounds and --iters must be >= 1")
    only = {s for s in a.only.split(",") if s}
    long = []
    for rnd in range(a.rounds):
        for name, args in _commands(a.iters):
            if only and name not in only:
                continue
            for tree, src in (("before", a.before), ("after", a.after)) if rnd % 2 == 0 else \
                    (("after", a.after), ("before", a.before)):
                for r in _run_tree(src, args, Path(f"/tmp/ab_build_{tree}")):
                    if r.get("median_us") is None:
                        continue
                    case = r.get("case") if name != "router" else f"m={r.get('m')}"
                    # rows are matched by the impl ASKED for: a tree may name its row differently (the router's
                    # "bf16x2" row became "dispatch"); the row's own name is kept beside
                    long.append({"tree": tree, "round": rnd, "op": name, "case": case,
                                 "impl": args[args.index("--impl") + 1], "row_impl": r.get("impl"),
                                 "median_us": float(r["median_us"])})
                print(f"[ab] round {rnd} {name} {tree}: {sum(1 for x in long if x['tree'] == tree)} rows", flush=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    import csv

    with open(f"{a.out}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["tree", "round", "op", "case", "impl", "row_impl", "median_us"])
        w.writeheader()
        w.writerows(long)
    keys = sorted({(x["op"], x["case"], x["impl"]) for x in long}, key=lambda k: (k[0], str(k[1]), str(k[2])))
    lines = ["| op | case | impl | before us | after us | after/before |", "|---|---|---|---|---|---|"]
    worst = 0.0
    for k in keys:
        med = {t: [x["median_us"] for x in long if (x["op"], x["case"], x["impl"]) == k and x["tree"] == t]
               for t in ("before", "after")}
        if not med["before"] or not med["after"]:
            continue
        b, af = statistics.median(med["before"]), statistics.median(med["after"])
        worst = max(worst, af / b)
        lines.append(f"| {k[0]} | {k[1]} | {k[2]} | {b:.2f} | {af:.2f} | {af / b:.3f} |")
    lines.append(f"\nworst after/before: {worst:.3f}")
    Path(f"{a.out}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
