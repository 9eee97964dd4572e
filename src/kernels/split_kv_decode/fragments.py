"""Index model of the v3 attention kernel's MMA fragments (attention.cu, attention_v3_kernel), checked on the CPU.

The v3 kernel computes S^T = K Q^T with mma.m16n8k32 (e4m3) and O^T += V^T P^T with mma.m16n8k16 (f16), turning
S^T's accumulator into PV's B operand with movmatrix.trans. Each function below returns, for one warp, which
element every register slot holds, written from the PTX ISA fragment layouts (lane = 4 g + t, g = groupID,
t = threadID_in_group) and the kernel's own choices (which 16 B units a lane loads, which dims an m-tile row
stands for). check_v3_maps() asserts what makes the products right: in every MMA the A and B k-slots meet on the
same head dim (QK) or token (PV), the k permutation covers every dim exactly once, and the merge writes every
accumulator to its real dim. It is the check that was run before the kernel first ran on a GPU.
"""

from __future__ import annotations

LANES = [(lane, lane >> 2, lane & 3) for lane in range(32)]  # (lane, g, t)


def qk_slots(ks: int) -> tuple[dict, dict]:
    """k32 step ks (0..3) of S^T = K Q^T: A[(m, k)] -> (token m, dim), B[(k, n)] -> (query row n, dim).

    A (16 x 32, e4m3): a0 = (g, 4t..4t+3), a1 = (g+8, 4t..), a2 = (g, 16+4t..), a3 = (g+8, 16+4t..); B (32 x 8):
    b0 = (4t.., g), b1 = (16+4t.., g). The kernel: a lane loads 32 B (dims 32t..32t+31) of its K rows g, g+8 and of
    Q row g; a0/b0 = word 2 ks, a2/b1 = word 2 ks + 1 (word w = dims 32t + 4w .. +3)."""
    A, B = {}, {}
    for _, g, t in LANES:
        for i in range(4):
            lo, hi = 32 * t + 4 * (2 * ks) + i, 32 * t + 4 * (2 * ks + 1) + i
            A[(g, 4 * t + i)] = (g, lo)
            A[(g + 8, 4 * t + i)] = (g + 8, lo)
            A[(g, 16 + 4 * t + i)] = (g, hi)
            A[(g + 8, 16 + 4 * t + i)] = (g + 8, hi)
            B[(4 * t + i, g)] = (g, lo)
            B[(16 + 4 * t + i, g)] = (g, hi)
    return A, B


def p_transpose() -> dict:
    """movmatrix.trans of the f16-packed S^T accumulator: lane -> ((token, row) low half, (token, row) high half).

    Source (C of S^T, one 8 x 8 half): lane holds (token g, rows 2t, 2t+1); the transpose gives lane (g, t) the
    (tokens 2t, 2t+1; row g) pair: exactly PV's B fragment b0 (k = 2t, 2t+1; n = g). The second half (tokens 8..15)
    gives b1."""
    return {lane: ((2 * t, g), (2 * t + 1, g)) for lane, g, t in LANES}


def pv_a_slots(j: int) -> dict:
    """m-tile j (0..7) of O^T += V^T P^T: A[(m, k)] -> (head dim, token k).

    A (16 x 16, f16): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..). The kernel: lane
    (g, t) loads dims 16g..16g+15 of tokens 2t, 2t+1, 2t+8, 2t+9 and pairs bytes with prmt; m-tile j = 4 wq + b uses
    byte b of word wq (rows g) and of word wq + 2 (rows g + 8)."""
    wq, b = j >> 2, j & 3
    A = {}
    for _, g, t in LANES:
        for kk in range(2):
            tok = 2 * t + kk
            A[(g, tok)] = (16 * g + 4 * wq + b, tok)
            A[(g + 8, tok)] = (16 * g + 4 * (wq + 2) + b, tok)
            A[(g, tok + 8)] = (16 * g + 4 * wq + b, tok + 8)
            A[(g + 8, tok + 8)] = (16 * g + 4 * (wq + 2) + b, tok + 8)
    return A


def merge_unit(r: int, u: int) -> int:
    """Swizzled position of 16 B unit u of merge row r (attention.cu merge3_swz)."""
    return u ^ ((r >> 1) & 3)


def check_v3_maps() -> dict:
    """Assert the v3 fragment maps are consistent; returns a few facts for display. Raises AssertionError."""
    dims = set()
    for ks in range(4):
        A, B = qk_slots(ks)
        for m in range(16):
            for n in range(8):
                for k in range(32):
                    (tok, da), (row, db) = A[(m, k)], B[(k, n)]
                    assert tok == m and row == n and da == db, (ks, m, n, k)
        dims |= {A[(0, k)][1] for k in range(32)}
    assert dims == set(range(128)), "QK k slots must cover every head dim once"
    for lane, (lo, hi) in p_transpose().items():
        g, t = lane >> 2, lane & 3
        assert lo == (2 * t, g) and hi == (2 * t + 1, g)  # = PV's B fragment b0 (k = 2t, 2t+1; n = g)
    pv_dims = set()
    for j in range(8):
        A = pv_a_slots(j)
        for m in range(16):
            row_dims = {A[(m, k)][0] for k in range(16)}
            assert len(row_dims) == 1, "one head dim per A row"
            assert [A[(m, k)][1] for k in range(16)] == list(range(16)), "k slot k = token k (P^T's k)"
            d = row_dims.pop()
            assert d == (16 * (m % 8) + j if m < 8 else 16 * (m % 8) + 8 + j)
            pv_dims.add(d)
    assert pv_dims == set(range(128)), "PV rows must cover every head dim once"
    # merge writes: lane (g, t), column c, quarter q stores dims 16g + 4q' .. as unit 4g + q of row 2t + c;
    # within one store instruction the 8 lanes of a quarter warp hit 8 distinct bank groups
    for c in range(2):
        for q in range(4):
            for quarter in range(4):
                groups = {merge_unit(2 * t + c, 4 * g + q) & 7 for lane, g, t in LANES if lane // 8 == quarter}
                assert len(groups) == 8, (c, q, quarter)
    return {"qk_dims_covered": len(dims), "pv_dims_covered": len(pv_dims), "mma_per_warp_tile_qk": 4,
            "mma_per_warp_tile_pv": 8}
