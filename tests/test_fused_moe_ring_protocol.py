"""The warp-specialized expert GEMM's ring protocol with several producer warps, model-checked on the CPU.

expert_wgmma.cu's ``expert_wgmma_ws_kernel``: STAGES slots, each with a "full" and an "empty" mbarrier; producer warp
``pw`` of ``PRODUCERS`` fills steps pw, pw + PRODUCERS, ... (step i goes to slot i % STAGES); the consumers take the
steps in order. A producer at step i >= STAGES waits on the slot's "empty" barrier for parity ((i / STAGES) & 1) ^ 1
and a consumer on "full" for (i / STAGES) & 1. An mbarrier parity wait passes when the barrier's current phase
parity differs from the one asked, so it cannot tell a phase from the one two phases earlier: the kernel's
``static_assert(PRODUCERS <= STAGES)`` rests on the argument that a producer is then never more than one phase
ahead of its slot. This explores every interleaving of the producers and the consumer for small rings and checks
that no slot is refilled before its previous step was consumed and that the consumer always reads the step it
waits for; with PRODUCERS > STAGES it must find the early pass.
"""

from __future__ import annotations

import pytest


def _explore(stages: int, producers: int, steps: int) -> str | None:
    """Depth-first over all interleavings. Returns a description of the first violation, or None."""
    # state: next step per producer, next consumer step, completed phases of full[s] / empty[s], step held per slot
    start = (tuple(range(producers)), 0, (0,) * stages, (0,) * stages, (-1,) * stages, (True,) * stages)
    seen = set()
    todo = [start]
    while todo:
        state = todo.pop()
        if state in seen:
            continue
        seen.add(state)
        nxt, cons, full, empty, held, consumed = state
        for pw in range(producers):
            i = nxt[pw]
            if i >= steps:
                continue
            s = i % stages
            if i >= stages and (empty[s] & 1) == (((i // stages) & 1) ^ 1):
                continue  # empty wait not passed yet
            if not consumed[s]:
                return f"producer {pw} refilled slot {s} with step {i} before step {held[s]} was consumed"
            n2 = nxt[:pw] + (i + producers,) + nxt[pw + 1:]
            full2 = full[:s] + (full[s] + 1,) + full[s + 1:]
            held2 = held[:s] + (i,) + held[s + 1:]
            cons2 = consumed[:s] + (False,) + consumed[s + 1:]
            todo.append((n2, cons, full2, empty, held2, cons2))
        if cons < steps:
            s = cons % stages
            if (full[s] & 1) != ((cons // stages) & 1):  # full wait passed
                if held[s] != cons:
                    return f"consumer at step {cons} read step {held[s]} from slot {s}"
                empty2 = empty[:s] + (empty[s] + 1,) + empty[s + 1:]
                cons2 = consumed[:s] + (True,) + consumed[s + 1:]
                todo.append((nxt, cons + 1, full, empty2, held, cons2))
    return None


@pytest.mark.parametrize("stages,producers", [(s, p) for s in (2, 3, 4) for p in range(1, s + 1)] + [(8, 4)])
def test_ring_safe_while_producers_at_most_stages(stages, producers):
    steps = 3 * stages + producers + 1  # every slot wraps at least twice, every producer takes several steps
    assert _explore(stages, producers, steps) is None


@pytest.mark.parametrize("stages,producers", [(2, 3), (3, 4), (3, 5)])
def test_ring_breaks_with_more_producers_than_stages(stages, producers):
    """The model is not vacuous: past the kernel's static_assert a parity wait passes a phase early."""
    got = _explore(stages, producers, 3 * stages + producers + 1)
    assert got is not None and "refilled" in got, got
