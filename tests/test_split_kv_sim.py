"""CPU tests of the split-KV scheduling simulator."""
import numpy as np
import pytest

from hotpaths.reference.split_kv_decode import build_task_map
from hotpaths.reference.split_kv_sim import (
    SimCosts,
    calibrate,
    make_maps,
    plot_task_map,
    prediction_error,
    simulate,
    simulate_map,
    skew_sweep,
    task_map_image,
)


def test_equal_total_work_across_schedules():
    lens = [131072] + [4096] * 31
    res = simulate(lens)
    tiles = {k: int(r.per_cta_tiles.sum()) for k, r in res.items()}
    assert len(set(tiles.values())) == 1 and tiles["dynamic"] == (131072 + 31 * 4096) // 64
    assert res["dynamic"].grid == 132 and res["static_chunk"].empty_ctas > 0


def test_dynamic_not_slower_on_skewed_inputs():
    for pt in skew_sweep(32 * 4096, batch=32)[1:]:
        res = simulate(pt["lengths"])
        dyn = res["dynamic"].total_us
        assert dyn <= res["static_count"].total_us and dyn <= res["static_chunk"].total_us, pt["case"]


def test_dynamic_advantage_grows_with_skew():
    pts = skew_sweep(32 * 4096, batch=32)
    ratio = [simulate(p["lengths"])["static_count"].total_us / simulate(p["lengths"])["dynamic"].total_us
             for p in pts]
    assert ratio[-1] > 2 * ratio[0]
    assert all(b >= a - 1e-9 for a, b in zip(ratio, ratio[1:]))


def test_skew_sweep_constant_total():
    pts = skew_sweep(100_000, batch=16)
    assert all(int(p["lengths"].sum()) == 100_000 for p in pts)
    assert [p["skew"] for p in pts] == sorted(p["skew"] for p in pts)
    assert pts[0]["skew"] < 1.2
    with pytest.raises(ValueError, match="total_tokens"):
        skew_sweep(100, batch=16)


def test_list_scheduling_waves():
    # 264 equal CTAs on 132 slots: two waves
    tm = make_maps([64 * 8] * 264, sm_count=132, num_splits=1)["static_count"]
    c = SimCosts(tile_us=1.0, cta_us=0.0, desc_us=0.0, combine_fixed_us=0.0, combine_chunk_us=0.0, launch_us=0.0)
    r = simulate_map(tm, slots=132, costs=c)
    assert r.attention_us == pytest.approx(16.0)
    r2 = simulate_map(tm, slots=264, costs=c)
    assert r2.attention_us == pytest.approx(8.0)


def test_empty_batch():
    res = simulate([])
    c = SimCosts()
    assert res["static_count"].total_us == pytest.approx(c.launch_us)  # empty grid
    assert res["static_chunk"].total_us == pytest.approx(c.launch_us)
    assert res["dynamic"].total_us == pytest.approx(c.launch_us + c.cta_us)  # persistent CTAs still start


def test_calibrate_recovers_costs():
    true = SimCosts(0.4, 1.5, 0.2, 2.5, 0.1, 4.0)
    rows = []
    for pt in skew_sweep(32 * 4096) + skew_sweep(64 * 512, batch=64):
        for k, v in simulate(pt["lengths"], costs=true).items():
            rows.append(dict(case=list(pt["lengths"]), impl=k, median_us=v.total_us))
    rows.append(dict(case=[64], impl="reference (emulation)", median_us=float("nan")))
    fit = calibrate(rows)
    for f in ("tile_us", "cta_us", "launch_us"):
        assert getattr(fit, f) == pytest.approx(getattr(true, f), rel=1e-3)
    err = prediction_error(rows, fit)
    assert len(err) == len(rows) - 1 and max(abs(e["rel_err"]) for e in err) < 1e-6
    with pytest.raises(ValueError, match=">= 3"):
        calibrate(rows[:2])


def test_task_map_image():
    tm = build_task_map([300, 65], 1, 3, min_tiles=1)
    img = task_map_image(tm)
    assert img.shape == (3, tm.budget)
    assert np.nansum(~np.isnan(img)) == tm.total_tiles
    assert img[:2].tolist() == [[0, 0, 0], [0, 0, 1]]  # 5 tiles of request 0, then request 1
    assert img[2, 0] == 1 and np.isnan(img[2, 1:]).all()
    import matplotlib
    matplotlib.use("Agg")
    ax = plot_task_map(tm)
    shown = ax.images[0].get_array()  # the heat map drawn is the task map's image: per-CTA tiles, by request
    assert shown.shape == img.shape
    assert np.array_equal(np.ma.filled(shown.astype(float), np.nan), img, equal_nan=True)
    per_cta_tiles = (~np.isnan(img)).sum(axis=1)
    assert per_cta_tiles.tolist() == [3, 3, 1] and per_cta_tiles.sum() == tm.total_tiles
    assert f"{tm.total_tiles} tiles over {tm.num_ctas} CTAs" in ax.get_title()
