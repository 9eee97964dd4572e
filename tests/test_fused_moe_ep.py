"""CPU tests of the expert-parallel MoE layer (hotpaths.reference.fused_moe_ep): gloo, 2 and 4 processes on one
machine; dispatch + per-rank emulation + combine equals the single-process emulation over all experts bit for bit,
under uneven routing, ranks that receive nothing or everything, ranks without tokens, and the micro-batch overlap.
A deadline turns a hang into a failure."""

from __future__ import annotations

import os
import socket
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hotpaths.reference import fused_moe as fm
from hotpaths.reference import fused_moe_ep as ep

DEADLINE_S = 90.0
TOPK, HIDDEN, INTER_PER_RANK = 4, 128, 64


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _layer(world: int, tokens: list[int], scales: str, routing: str, seed: int) -> dict:
    """The whole layer (all experts, every rank's tokens concatenated) and its per-rank token ids; the same on every
    rank (seeded)."""
    e_total = 2 * world
    inp = fm.make_moe_inputs(sum(tokens), mode="tp8ep1", experts=e_total, topk=TOPK, hidden=HIDDEN,
                             inter=8 * INTER_PER_RANK, scales=scales, seed=seed, shared=True)
    g = torch.Generator().manual_seed(seed + 1)
    ids = inp["topk_ids"]
    n = ids.shape[0]
    if routing == "to_rank0":  # every slot on rank 0's experts (duplicates allowed): rank 0 receives all
        ids = torch.randint(0, 2, (n, TOPK), generator=g).int()
    elif routing == "skip_last":  # the last rank's experts never drawn, a quarter of the slots skipped
        ids = torch.randint(0, e_total - 2, (n, TOPK), generator=g).int()
        ids[torch.rand(n, TOPK, generator=g) < 0.25] = -1
    elif routing == "uneven":  # three quarters of the slots on the last rank's experts
        ids = torch.where(torch.rand(n, TOPK, generator=g) < 0.75, torch.randint(e_total - 2, e_total, (n, TOPK),
                          generator=g), ids.long()).int()
    inp["topk_ids"] = ids.contiguous()
    return inp


CASES = [  # (tokens per rank as a function of world, scales, routing, micro_batches)
    (lambda w: [6] * w, "pertensor", "random", 1),
    (lambda w: [5, 0] + [3] * (w - 2), "block", "uneven", 1),
    (lambda w: [4] * w, "pertensor", "to_rank0", 1),
    (lambda w: [1] + [7] * (w - 1), "block", "skip_last", 2),
    (lambda w: [9, 2] + [0] * (w - 2), "pertensor", "random", 2),
]


def _worker(rank: int, world: int, port: int) -> None:
    for name, val in ep.MULTICAST_OFF.items():  # set by the launcher, inherited by this process
        assert os.environ.get(name) == val, f"{name} not inherited by the worker"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    try:
        for ci, (tok_fn, scales, routing, mb) in enumerate(CASES):
            tokens = tok_fn(world)
            inp = _layer(world, tokens, scales, routing, seed=ci)
            a, kw = fm.call_args(inp)
            want = fm.fused_moe_emulation(*a, **kw)  # single process, all experts
            e = inp["num_experts"] // world
            lo = sum(tokens[:rank])
            sl = slice(lo, lo + tokens[rank])
            local = {n: inp[n] for n in ("scales", "a1_scale", "a2_scale")}
            for n in ("w13", "w2", "w13_scale", "w2_scale"):
                local[n] = inp[n][rank * e:(rank + 1) * e]
            got_rows = torch.zeros(1, dtype=torch.int64)
            fn = ep.emulation_expert_fn(local, rank * e)

            def counting(rx, ri, fn=fn, got_rows=got_rows):
                assert bool(((ri >= rank * e) & (ri < (rank + 1) * e)).all()), "received another rank's expert id"
                got_rows += rx.shape[0]
                return fn(rx, ri)

            out = ep.ep_moe(inp["x"][sl], inp["topk_ids"][sl], inp["topk_weights"][sl], experts_per_rank=e,
                            expert_fn=counting, shared_out=inp["shared_out"][sl], micro_batches=mb)
            assert out.dtype == torch.bfloat16 and out.shape == (tokens[rank], HIDDEN)
            assert torch.equal(out, want[sl]), f"case {ci} rank {rank}: EP differs from the single-process emulation"
            # the rows this rank computed are exactly the valid pairs on its experts, over all ranks' tokens
            ids = inp["topk_ids"].long()
            mine = int(((ids >= rank * e) & (ids < (rank + 1) * e)).sum())
            assert int(got_rows) == mine, f"case {ci} rank {rank}: computed {int(got_rows)} rows, expected {mine}"
            if routing == "to_rank0":
                assert mine == (sum(tokens) * TOPK if rank == 0 else 0)
            if routing == "skip_last" and rank == world - 1:
                assert mine == 0
    finally:
        dist.destroy_process_group()


def _spawn(world: int) -> None:
    ep.multicast_off()
    ctx = mp.start_processes(_worker, args=(world, free_port()), nprocs=world, join=False, start_method="spawn")
    deadline = time.monotonic() + DEADLINE_S
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.terminate()
            pytest.fail(f"EP test with {world} processes hung past {DEADLINE_S} s")


@pytest.mark.parametrize("world", [2, 4])
def test_ep_equals_single_process_bit_for_bit(world):
    _spawn(world)


def test_route_pairs_groups_by_rank_in_pair_order():
    ids = torch.tensor([[3, -1, 0], [1, 2, 3]], dtype=torch.int32)
    r = ep.route_pairs(ids, experts_per_rank=2, world_size=2)
    assert r.send_counts == [2, 3]  # experts 0-1 on rank 0, 2-3 on rank 1; the -1 slot goes nowhere
    assert r.pair_index.tolist() == [2, 3, 0, 4, 5]  # rank-major, ascending pair id t*K+k inside a rank


def test_route_pairs_rejects_bad_ids():
    with pytest.raises(ValueError, match="topk_ids"):
        ep.route_pairs(torch.tensor([[4]], dtype=torch.int32), experts_per_rank=2, world_size=2)
    with pytest.raises(ValueError, match="topk_ids"):
        ep.route_pairs(torch.tensor([[-2]], dtype=torch.int32), experts_per_rank=2, world_size=2)
    with pytest.raises(TypeError, match="topk_ids"):
        ep.route_pairs(torch.tensor([[1]], dtype=torch.int64), experts_per_rank=2, world_size=2)
    with pytest.raises(ValueError, match="world_size"):
        ep.route_pairs(torch.tensor([[1]], dtype=torch.int32), experts_per_rank=2, world_size=0)


def test_a2a_bytes_per_token_hy3():
    b = ep.a2a_bytes_per_token(topk=8, hidden=4096, world_size=8)
    assert b["total"] == 2 * 8 * 4096 * 2 and b["local_fraction"] == 1 / 8
    assert b["remote"] == b["total"] * 7 / 8


def _cli(*args, timeout=DEADLINE_S):
    import subprocess
    import sys
    from pathlib import Path

    import hotpaths

    # the child imports the same hotpaths as this process (a worktree's .hp link or an installed package)
    root = str(Path(hotpaths.__path__[0]).parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    return subprocess.run([sys.executable, "-m", "hotpaths", "moe", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU (gloo, emulation) path runs only without CUDA")
def test_cli_ep_cpu_path_is_bit_exact():
    import json

    r = _cli("--ep", "2", "--batch", "0,3", "--json", "--iters", "1")
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert [row["batch"] for row in rows] == [0, 3]
    for row in rows:
        assert row["op"] == "fused_moe_ep" and row["ep"] == 2 and row["gpus"] == "2x cpu (gloo)"
        assert row["bit_exact"] is True and row["impl"].startswith("ep_emulation")
        assert row["dispatch_us"] > 0 and row["median_us"] >= row["compute_us"]
    assert rows[0]["recv_rows_max"] == 0 and rows[1]["recv_rows_max"] > 0


def test_run_ep_exits_2_with_too_few_gpus(monkeypatch, capsys):
    from hotpaths.bench import fused_moe_ep as bep

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert bep.run_ep(4, [4]) == 2
    assert "needs 4 CUDA devices, this machine has 1" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--ep"):
        bep.run_ep(0, [4])
    with pytest.raises(ValueError, match="do not split evenly"):
        bep.run_ep(5, [4])  # hy3: 192 experts
