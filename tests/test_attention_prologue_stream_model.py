"""CPU model of the persistent prologue variants' queues (src/kernels/attention_prologue/prologue.cu: stream_kernel
and async_kernel), step by step as one lane runs them.

The kernels cannot run here, so their index arithmetic is mirrored: which ring stage an item is issued into and read
from, how many cp.async groups are committed before each cp.async.wait_group, which register set holds a position
or an angle set, and where the tail of a warp's item list (fewer items than the unroll or the queue depth) issues
inactive units. Every read must find the item it expects, complete; every refill must hit a stage already read. The
depths are read from prologue.cu, so a change of kAsyncDepth / kAsyncStages is checked as written.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

_CU = Path(__file__).resolve().parents[1] / "src" / "kernels" / "attention_prologue" / "prologue.cu"


def _const(name: str) -> int:
    """An integer constexpr of prologue.cu (its expression may name earlier constants)."""
    src = _CU.read_text()
    m = re.search(rf"constexpr int {name} = ([^;]+);", src)
    assert m, f"{name} not found in prologue.cu"
    expr = m.group(1).strip()
    names = {w: _const(w) for w in re.findall(r"\bk[A-Z]\w*", expr)}
    return int(eval(expr, {"__builtins__": {}}, names))  # noqa: S307 (an integer expression from our own source)


def async_lane_model(n: int, A: int, NS: int) -> list[int]:
    """One lane of async_kernel over its n items; returns the items it computed, in order. Items >= n are the
    inactive units item_unit() gives past the warp's last (their copies are committed as empty groups)."""
    U = NS if NS % 2 == 0 else 2 * NS
    stage = [None] * NS  # item whose copies target the stage (None: never issued)
    read = [True] * NS  # the stage's last item was read back (so a refill cannot overwrite unread data)
    groups: list[int] = []  # committed groups, in order: the item each one carries
    done = 0  # groups known complete (wait_group N: all but the newest N)
    pos = [None, None]  # the two position register sets: which item's position each holds

    def issue(item: int, st: int, pos_of: int) -> None:
        assert read[st], f"stage {st} refilled with item {item} before item {stage[st]} was read"
        assert pos_of == item, f"item {item} issued with the position of item {pos_of}"
        stage[st], read[st] = item, item >= n  # an inactive item is never read
        groups.append(item)

    fill = list(range(A))  # fill: positions of items 0..A-1 (fill_lo/hi), then item A's into pos[A % 2]
    pos[A % 2] = A
    for j in range(A):
        issue(j, j, fill[j])
    out = []
    base = 0
    while base < n:
        for k in range(U):
            j = base + k
            if j >= n:
                break
            pa = (k + A) % 2
            issue(j + A, (k + A) % NS, pos[pa])
            pos[1 - pa] = j + A + 1
            done = max(done, len(groups) - A)  # cp.async.wait_group A
            st = k % NS
            assert stage[st] == j, f"item {j} read from stage {st}, which holds item {stage[st]}"
            assert groups.index(j) < done, f"item {j} read before its group completed"
            read[st] = True
            out.append(j)
        base += U
    return out


def stream_lane_model(n: int, R: int) -> list[int]:
    """One lane of stream_kernel<D, R> over its n items; returns the items computed. ring[r] holds an item's qkv,
    slot and position; ang[a] the angle set computed from a position."""
    U = R if R % 2 == 0 else 2 * R
    ring = list(range(R))  # the prologue's loop: item k into ring[k]
    ang = [0, None]  # ang[0]: item 0's angles (from ring[0]'s position)
    assert ring[0] == 0
    out = []
    base = 0
    while base < n:
        for k in range(U):
            j = base + k
            if j >= n:
                break
            r, a = k % R, k % 2
            assert ring[r] == j, f"item {j} computed from ring[{r}] holding item {ring[r]}"
            ring[r] = j + R if j + R < n else n  # refill (n: an inactive unit)
            src = ring[(k + 1) % R]  # the next item's position, issued R - 1 items ago
            assert j + 1 >= n or src == j + 1, f"item {j + 1}'s angles from item {src}'s position"
            ang[1 - a] = src
            assert ang[a] == j, f"item {j} rotated with item {ang[a]}'s angles"
            out.append(j)
        base += U
    return out


def test_constants_read_from_the_source():
    A, NS = _const("kAsyncDepth"), _const("kAsyncStages")
    assert A >= 1 and NS == A + 1  # one stage more than the items in flight: the refilled stage was read before


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 33])
def test_async_ring_reads_every_item_complete_and_in_order(n):
    A, NS = _const("kAsyncDepth"), _const("kAsyncStages")
    assert async_lane_model(n, A, NS) == list(range(n))


@pytest.mark.parametrize("A,NS", [(2, 3), (3, 4), (4, 5)])
def test_async_ring_other_depths(A, NS):
    # odd stage counts unroll over 2 * NS (the position parity must stay static): the same invariants
    for n in (1, 2, A, A + 1, 2 * NS - 1, 2 * NS, 5 * NS + 1):
        assert async_lane_model(n, A, NS) == list(range(n))


def test_async_ring_without_the_spare_stage_fails():
    # the model can fail: with as many stages as items in flight, a refill overwrites the stage being read
    with pytest.raises(AssertionError, match="refilled|holds"):
        async_lane_model(8, 3, 3)


@pytest.mark.parametrize("R", [2, 3])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 13])
def test_stream_ring_and_angle_sets(n, R):
    assert stream_lane_model(n, R) == list(range(n))
