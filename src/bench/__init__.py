"""One benchmark module per op: ``hotpaths.bench.<op>`` holds the op's tables (row functions the notebook and the
CLI call), its peers' adapters (``hotpaths.bench.<op>_peers``) and its command-line subcommand
(``register(subparsers)``). This is the only layer that knows both an op and the harness:

    hotpaths.reference.common  <-  hotpaths.reference.<op>  <-  hotpaths.kernels.<op>  <-  hotpaths.bench.<op>
                                   hotpaths.harness (generic: bench, check, tables, ceilings, ncu, runs)  <-'

The CLI (hotpaths.harness.cli) imports these modules by name from OPS, so the harness never imports an op.
"""

# Op slugs, in notebook order; each has data/shapes/<op>.yaml, src/reference/<op>.py, src/kernels/<op>/,
# this package's <op>.py, tests/test_<op>_*.py and a notebook (docs/adding_an_op.md).
OPS = ("split_kv_decode", "attention_prologue", "router_gemm", "fused_moe")

# Commands that are not one op's (each module has register(subparsers)): hotpaths step (decode_step), the report's
# README updater (report) and the fuzz sweep over every op (fuzz).
COMMANDS = ("decode_step", "report", "fuzz")
