"""The EP layer on 2+ SM90 GPUs (NCCL, the fused kernel per rank) against the single-GPU layer. Skipped with fewer
than 2 GPUs. The full table is ``hotpaths moe --ep N`` (docs/ops/fused_moe_ep.md, "Not run")."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from bounded_child import run_child

from hotpaths.harness.env import requires_sm90

pytestmark = [pytest.mark.gpu, requires_sm90()]


def _rows(world: int) -> list[dict]:
    # bounded: a rank stuck in the NCCL rendezvous (or one that never exits) fails the test, ranks killed
    r = run_child([sys.executable, "-m", "hotpaths", "moe", "--ep", str(world), "--batch", "0,4,64", "--json",
                   "--iters", "3"], timeout=60, what=f"hotpaths moe --ep {world}")
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert [row["batch"] for row in rows] == [0, 4, 64]
    return rows


def test_ep1_runs_the_gpu_path_on_one_gpu():
    """NCCL with one rank: every pair stays local; the layer must still equal the one-GPU kernel closely."""
    for row in _rows(1)[1:]:
        assert row["cosine"] >= 0.9998, row
        assert row["gpus"].startswith("1x ") and row["single_gpu_us"] > 0


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="expert parallelism needs 2+ GPUs")
def test_ep2_matches_single_gpu_layer():
    for row in _rows(2)[1:]:
        # per-rank kernel + home-side reduce vs the one-GPU kernel: both within the kernel-vs-emulation tolerance
        assert row["cosine"] >= 0.9998, row
        assert row["dispatch_us"] > 0 and row["compute_us"] > 0 and row["combine_us"] > 0
        assert "H200" in row["gpus"] or "H100" in row["gpus"] or row["gpus"].startswith("2x")
