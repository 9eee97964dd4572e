"""The fuzz machinery on the CPU: guard bytes catch a write outside a buffer, untouched-slot checks, the draw
interface, the `hotpaths fuzz` command (emulation path, table, repro by --config) and the sanitizer log parser."""

import json

import numpy as np
import pytest
import torch

from hotpaths.bench import fuzz as FZ
from hotpaths.harness import fuzzing
from hotpaths.harness.cli import main


def test_guards_catch_writes_outside_the_buffer():
    g = fuzzing.GuardedBuffers()
    a = g.alloc("a", (4, 8), torch.float32, "cpu", fill=float("nan"))
    b = g.adopt("b", torch.arange(6, dtype=torch.int32))
    assert torch.isnan(a).all() and b.tolist() == list(range(6))
    a.fill_(1.0)  # writes inside the buffers are fine
    b.zero_()
    assert g.violations() == []
    raw, _ = g._bufs["a"]
    raw[g.guard + a.numel() * 4 + 3] = 0  # one byte past the end of a
    raw[g.guard - 1] = 7                  # one byte before it
    v = g.violations()
    assert len(v) == 2 and "a: guard after" in v[1] and "3 bytes past its end" in v[1]
    assert "a: guard before" in v[0] and "1 bytes before its start" in v[0] and "0x07" in v[0]


def test_guarded_views_are_aligned():
    g = fuzzing.GuardedBuffers()
    for i, shape in enumerate([(3,), (5, 7), (1, 2, 3)]):
        t = g.alloc(f"t{i}", shape, torch.bfloat16, "cpu")
        assert t.data_ptr() % 256 == g._bufs[f"t{i}"][0].data_ptr() % 256


def test_unchanged_flags_only_masked_rows():
    before = torch.zeros(6, 4)
    after = before.clone()
    after[2, 1] = 1.0
    mask = torch.tensor([True, True, False, True, True, True])
    assert fuzzing.unchanged(before, after, mask, name="c") == []
    assert "row 2" in fuzzing.unchanged(before, after, name="c")[0]


def test_numpy_draw_is_seeded_and_inclusive():
    d1, d2 = fuzzing.NumpyDraw(np.random.default_rng(3)), fuzzing.NumpyDraw(np.random.default_rng(3))
    xs = [d1.integer(0, 2) for _ in range(200)]
    assert xs == [d2.integer(0, 2) for _ in range(200)] and set(xs) == {0, 1, 2}
    assert isinstance(d1.choice((4, 5)), int)
    with pytest.raises(ValueError, match="empty range"):
        d1.integer(3, 2)


def test_fuzz_command_writes_table_and_repro_reruns(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOTPATHS_RESULTS_DIR", str(tmp_path))
    saved = {}
    monkeypatch.setattr(FZ.tables, "save", lambda rows, name, **kw: saved.setdefault(name, rows))
    assert main(["fuzz", "--op", "router_gemm", "--n", "3", "--seed", "5", "--json"]) == 0
    rows = [json.loads(ln) for ln in capsys.readouterr().out.splitlines() if ln.startswith("{")]
    assert len(rows) == 3 and all(r["status"] == "ok" and r["path"].startswith("cpu") for r in rows)
    assert len(saved["fuzz_router_gemm"]) == 3
    cfg = rows[1]["config"]
    assert main(["fuzz", "--op", "router_gemm", "--config", cfg, "--json"]) == 0
    again = [json.loads(ln) for ln in capsys.readouterr().out.splitlines() if ln.startswith("{")]
    assert again[0]["config"] == cfg and again[0]["status"] == "ok"


def test_fuzz_failure_is_a_row_with_its_repro(monkeypatch):
    from hotpaths.bench import router_gemm_fuzz as F

    monkeypatch.setattr(F, "check_cpu", lambda cfg: {"failures": ["boom"], "path": "cpu"} if cfg["m"] % 2 else
                        {"failures": []})
    rows = fuzzing.sweep("router_gemm", F.fuzz_case, F.fuzz_run, n=12, seed=0, kernel=False)
    bad = [r for r in rows if r["status"] != "ok"]
    assert bad and all(r["repro"].startswith("hotpaths fuzz --op router_gemm --config '") for r in bad)
    assert all(json.loads(r["config"])["m"] % 2 == 1 for r in bad)
    assert fuzzing.summary(rows)["router_gemm"]["failed"] == len(bad)

    assert all(r["metrics"] == "" for r in rows)  # the CPU runner reports no metrics
    monkeypatch.setattr(F, "check_cpu", lambda cfg: {"failures": [], "metrics": {"rel": 1 / 3, "n": cfg["m"]}})
    rows = fuzzing.sweep("router_gemm", F.fuzz_case, F.fuzz_run, n=2, seed=0, kernel=False)
    assert [json.loads(r["metrics"]) for r in rows] == [{"rel": 0.3333, "n": json.loads(r["config"])["m"]}
                                                         for r in rows]

    def crash(cfg):
        raise IndexError("kaboom")
    rows = fuzzing.sweep("router_gemm", F.fuzz_case, crash, n=2, seed=0, kernel=False)
    assert [r["status"] for r in rows] == ["error", "error"] and "IndexError: kaboom" in rows[0]["failures"]


LOG = """========= COMPUTE-SANITIZER
hotpaths-sanitize-case split_kv_decode 0
sanitize split_kv_decode case 0: ok
hotpaths-sanitize-case split_kv_decode 1
========= Invalid __global__ read of size 4 bytes
=========     at attention_kernel+0x1a0
=========     by thread (3,0,0) in block (7,0,0)
========= Invalid __global__ read of size 4 bytes
=========     at attention_kernel+0x1a0
sanitize split_kv_decode case 1: FAIL: out differs
========= ERROR SUMMARY: 2 errors
"""


def test_parse_sanitizer_log():
    r = fuzzing.parse_sanitizer_log(LOG)
    assert r["summary"] == 2 and r["per_case"] == {0: 0, 1: 2}
    assert r["first"] == "Invalid __global__ read of size 4 bytes"
    assert r["case_status"] == {0: "ok", 1: "FAIL: out differs"}
    refused = fuzzing.parse_sanitizer_log("========= COMPUTE-SANITIZER\n========= Error: tool not supported\n")
    assert refused["summary"] is None


RACE_LOG = """========= COMPUTE-SANITIZER
hotpaths-sanitize-case fused_moe 0
sanitize fused_moe case 0: ok
hotpaths-sanitize-case fused_moe 1
========= Error: Race reported between Read access at void at::native::reduce_kernel<512, 1>(T3)+0xe800
=========     and Write access at void at::native::reduce_kernel<512, 1>(T3)+0xe8e0 [512 hazards]
sanitize fused_moe case 1: ok
hotpaths-sanitize-case fused_moe 2
========= Error: Race reported between Write access at expert_gemm_kernel+0x100
=========     and Read access at expert_gemm_kernel+0x200 [4 hazards]
sanitize fused_moe case 2: ok
========= RACECHECK SUMMARY: 2 hazards displayed (2 errors, 0 warnings)
"""


def test_parse_racecheck_summary_and_library_reports():
    # racecheck ends with its own summary line (no ERROR SUMMARY); a race inside a PyTorch reduction that the
    # driver's checks launched is counted apart from one in our kernel
    r = fuzzing.parse_sanitizer_log(RACE_LOG)
    assert r["summary"] == 2 and r["library"] == 1
    assert r["per_case"] == {0: 0, 1: 0, 2: 1} and r["per_case_library"] == {0: 0, 1: 1, 2: 0}
    assert r["first"].startswith("Error: Race reported between Write access at expert_gemm_kernel")
    clean = fuzzing.parse_sanitizer_log("========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n")
    assert clean["summary"] == 0 and clean["library"] == 0


def test_sanitizer_table_counts_only_our_kernels(tmp_path):
    (tmp_path / "racecheck__fused_moe.log").write_text(RACE_LOG)
    total = next(r for r in FZ.sanitizer_table(str(tmp_path)) if r["case"] == "all")
    assert total["errors"] == 1 and total["library_reports"] == 1
    assert "at::native::reduce_kernel" in total["first_library_report"]
    assert "expert_gemm_kernel" in total["first_report"]


def test_sanitizer_table_rows(tmp_path):
    (tmp_path / "memcheck__split_kv_decode.log").write_text(LOG)
    (tmp_path / "racecheck__split_kv_decode.log").write_text("compute-sanitizer not found\n")
    rows = FZ.sanitizer_table(str(tmp_path))
    by = {(r["tool"], r["case"]): r for r in rows}
    n = len(__import__("hotpaths.bench.split_kv_decode_fuzz", fromlist=["x"]).SANITIZE_CASES)
    assert len(rows) == 2 * (n + 1)
    assert by[("memcheck", "all")]["errors"] == 2 and by[("memcheck", "1")]["errors"] == 2
    assert by[("memcheck", "0")]["errors"] == 0 and by[("memcheck", "2")]["checks"] == "not reached"
    assert by[("racecheck", "all")]["errors"] is None and "refused" in by[("racecheck", "all")]["checks"]
