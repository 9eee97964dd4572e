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
