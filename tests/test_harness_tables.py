import json
import math

import pandas as pd
import pytest

from hotpaths.harness import tables
from hotpaths.harness.bench import bench


def test_save_round_trip(tmp_path):
    rows = [dict(op="x", case="64x4K", impl="dynamic", median_us=12.5, bytes=67108864, extra_col="a"),
            dict(op="x", case="64x4K", impl="static", median_us=20.0, bytes=67108864, extra_col="b")]
    csv, md = tables.save(rows, "demo", out_dir=tmp_path)
    df = pd.read_csv(csv)
    assert list(df.columns[: len(tables.COLUMNS)]) == tables.COLUMNS
    assert df.columns[-1] == "extra_col"
    assert df["median_us"].tolist() == [12.5, 20.0]
    text = md.read_text()
    assert "| dynamic |" in text and "67108864" in text and "p10_us" not in text  # empty columns dropped


def test_save_rejects_bad_input(tmp_path):
    with pytest.raises(ValueError, match="name"):
        tables.save([{"op": "x"}], "../evil", out_dir=tmp_path)
    with pytest.raises(ValueError, match="no rows"):
        tables.save([], "empty", out_dir=tmp_path)


def test_json_lines_columns_and_nan():
    line = tables.json_lines([dict(op="x", median_us=float("nan"))]).splitlines()[0]
    obj = json.loads(line)
    assert list(obj)[: len(tables.COLUMNS)] == tables.COLUMNS and obj["median_us"] is None


def test_published_tables():
    d = tables.published("split_kv_decode")
    assert "1x128K+31x4K" in set(d["case"]) and math.isclose(
        float(d.set_index("case").loc["1x128K+31x4K", "dynamic_vs_static"]), 2.95)
    r = tables.published("router_gemm")
    assert (r["value"] == "0.00177").any()
    with pytest.raises(FileNotFoundError):
        tables.published("nope")


def test_bench_cpu_labels_wall_clock():
    t = bench(lambda: sum(range(100)), iters=20)
    assert t.method == "cpu_wall" and t.n == 20 and t.p10_us <= t.median_us <= t.p90_us


def test_bench_timing_options_validated(monkeypatch):
    """The event placement and the L2 flush mode are checked by name; the environment variable picks the flush when
    set_flush_mode has not, and a bad value names the variable."""
    from hotpaths.harness import bench as B

    with pytest.raises(ValueError, match="events"):
        B.bench(lambda: None, events="kernel")
    with pytest.raises(ValueError, match="flush mode"):
        B.set_flush_mode("zero")
    B.set_flush_mode(None)
    monkeypatch.delenv("HOTPATHS_L2_FLUSH", raising=False)
    assert B.flush_mode() == B.DEFAULT_FLUSH_MODE == "write"
    monkeypatch.setenv("HOTPATHS_L2_FLUSH", "read")
    assert B.flush_mode() == "read"
    B.set_flush_mode("write")
    assert B.flush_mode() == "write"  # the call wins over the environment
    # one setting for every timer: the kernels' own (the router's first-use tuner) read the same state
    from hotpaths.kernels import _timing as T

    assert T.flush_mode() == "write" and T.flush_l2 is B.flush_l2
    B.set_flush_mode(None)
    assert T.flush_mode() == "read"
    monkeypatch.setenv("HOTPATHS_L2_FLUSH", "clean")
    with pytest.raises(ValueError, match="HOTPATHS_L2_FLUSH"):
        B.flush_mode()


def test_stored_timing_studies_parse():
    """The committed H200 timing-method and flush studies parse into rows, and they say what the notes claim:
    events inside the graph give the lowest floor (the graph launch outside the span), and a read flush (clean L2)
    makes a 64 MB read faster than a write flush (dirty L2) while a trivial kernel does not care."""
    from hotpaths.harness.notebook import timing_studies

    method, flush = timing_studies("h200")
    method, flush = method.to_dict("records"), flush.to_dict("records")
    assert len(method) == 6 and {r["flush"] for r in method} == {"write", "read"}
    for r in method:
        assert r["graph_events_us"] < r["stream_events_us"], r
    one = next(r for r in method if r["flush"] == "write" and r["job"] == "1 trivial")
    assert 3.0 < one["graph_events_us"] < 3.6  # the 3.4 us
    by = {r["job"]: r for r in flush}
    assert by["sum64MB"]["read_over_write"] < 0.9 and 0.9 < by["floor1"]["read_over_write"] < 1.1


def test_save_is_stable_up_to_run_ids_and_rewrites_on_a_changed_number(tmp_path, monkeypatch):
    import os

    monkeypatch.setenv("HOTPATHS_RUN_ID", "20260101T000000Z-cpu-quick")
    row = {"op": "x", "case": "c", "median_us": 1.5}
    csv, md = tables.save([{**row, "run_id": "20260101T000000Z-cpu-quick"}], "t", out_dir=tmp_path)
    os.utime(csv, (1, 1))
    first = csv.read_bytes()
    tables.save([{**row, "run_id": "20261201T000000Z-cpu-quick"}], "t", out_dir=tmp_path)
    assert csv.read_bytes() == first and csv.stat().st_mtime == 1  # untouched: only the run id differs
    tables.save([{**row, "median_us": 1.6, "run_id": "20261201T000000Z-cpu-quick"}], "t", out_dir=tmp_path)
    assert ",1.6," in csv.read_text() and "20261201T000000Z-cpu-quick" in csv.read_text()
    assert "20261201T000000Z-cpu-quick" in md.read_text()


def test_save_failing_midway_leaves_the_previous_tables_whole(tmp_path, monkeypatch):
    import os

    csv, md = tables.save([{"op": "x", "median_us": 1.5}], "t", out_dir=tmp_path)
    old_csv, old_md = csv.read_bytes(), md.read_bytes()
    real = os.replace
    calls = []

    def dies_after_first(src, dst):  # a kill between the two renames
        calls.append(dst)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(src, dst)
    monkeypatch.setattr(os, "replace", dies_after_first)
    with pytest.raises(KeyboardInterrupt):
        tables.save([{"op": "x", "median_us": 2.5}], "t", out_dir=tmp_path)
    monkeypatch.setattr(os, "replace", real)
    assert md.read_bytes() == old_md  # the second file never saw a partial write
    assert not list(tmp_path.glob(".*tmp*"))  # nothing left aside
    # a failure while writing (before any rename) leaves both files as they were
    csv.write_bytes(old_csv)
    import builtins

    real_open = builtins.open

    def bad_open(path, mode="r", *a, **k):
        if "w" in mode and str(path).endswith(f".t.md.tmp-{os.getpid()}"):  # the second file fails
            raise OSError("disk full")
        return real_open(path, mode, *a, **k)
    monkeypatch.setattr(builtins, "open", bad_open)
    with pytest.raises(OSError):
        tables.save([{"op": "x", "median_us": 3.5}], "t", out_dir=tmp_path)
    monkeypatch.setattr(builtins, "open", real_open)
    assert csv.read_bytes() == old_csv and md.read_bytes() == old_md
    assert not list(tmp_path.glob(".*tmp*"))
