"""Index model of the v3 attention kernel's MMA fragments (attention.cu, attention_transposed), checked on the CPU;
check_v3_bf16_maps() does the same for the transposed layout on BF16 KV (v3b, v3bs3, v3bc3), check_v3w_maps() for the
warpgroup-MMA kernel's converted V^T tile and row map (v3w, v3wc3), check_v3w_bf16_layout() for that kernel's BF16
tiles and the K-major / MN-major descriptors that read them.

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


def check_qk(slots, steps: int, k_len: int) -> set:
    """Assert that in every k step of S^T = K Q^T (slots(ks) -> (A, B) maps) the A and B k slots meet on one head dim
    with m = token and n = query row, and that the steps cover every head dim once; returns the dims."""
    dims = set()
    for ks in range(steps):
        A, B = slots(ks)
        for m in range(16):
            for n in range(8):
                for k in range(k_len):
                    (tok, da), (row, db) = A[(m, k)], B[(k, n)]
                    assert tok == m and row == n and da == db, (ks, m, n, k)
        dims |= {A[(0, k)][1] for k in range(k_len)}
    assert dims == set(range(128)), "QK k slots must cover every head dim once"
    return dims


def check_pv(slots, dim_of) -> set:
    """Assert that every A row m of each m-tile j of O^T += V^T P^T (slots(j): (m, k) -> (dim, token)) is one head dim,
    dim_of(j, m), with k slot k = token k, and that the rows cover every head dim once; returns the dims."""
    pv_dims = set()
    for j in range(8):
        A = slots(j)
        for m in range(16):
            row_dims = {A[(m, k)][0] for k in range(16)}
            assert len(row_dims) == 1, "one head dim per A row"
            assert [A[(m, k)][1] for k in range(16)] == list(range(16)), "k slot k = token k (P^T's k)"
            d = row_dims.pop()
            assert d == dim_of(j, m), (j, m, d)
            pv_dims.add(d)
    assert pv_dims == set(range(128)), "PV rows must cover every head dim once"
    return pv_dims


def check_v3_maps() -> dict:
    """Assert the v3 fragment maps are consistent; returns a few facts for display. Raises AssertionError."""
    dims = check_qk(qk_slots, 4, 32)
    for lane, (lo, hi) in p_transpose().items():
        g, t = lane >> 2, lane & 3
        assert lo == (2 * t, g) and hi == (2 * t + 1, g)  # = PV's B fragment b0 (k = 2t, 2t+1; n = g)
    pv_dims = check_pv(pv_a_slots, lambda j, m: 16 * (m % 8) + j if m < 8 else 16 * (m % 8) + 8 + j)
    # merge writes: lane (g, t), column c, quarter q stores dims 16g + 4q' .. as unit 4g + q of row 2t + c;
    # within one store instruction the 8 lanes of a quarter warp hit 8 distinct bank groups
    for c in range(2):
        for q in range(4):
            for quarter in range(4):
                groups = {merge_unit(2 * t + c, 4 * g + q) & 7 for lane, g, t in LANES if lane // 8 == quarter}
                assert len(groups) == 8, (c, q, quarter)
    return {"qk_dims_covered": len(dims), "pv_dims_covered": len(pv_dims), "mma_per_warp_tile_qk": 4,
            "mma_per_warp_tile_pv": 8}


# ---- the transposed layout on BF16 KV (attention.cu, Traits<false, true, ...>: configs v3b, v3bs3, v3bc3) ----


def bf16_units(t: int) -> list[int]:
    """Logical 16 B units (8 dims each) a lane of tig t loads from a K or Q row, in word order (attention.cu kq_unit,
    BF16): 2t, 2t+1, 2t+8, 2t+9. Word w of the 16 holds dims 8 units[w // 4] + 2 (w % 4) + {0, 1}."""
    return [2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9]


def bf16_word_dims(t: int, w: int) -> tuple[int, int]:
    u = bf16_units(t)[w // 4]
    return 8 * u + 2 * (w % 4), 8 * u + 2 * (w % 4) + 1


def qk_slots_bf16(ks: int) -> tuple[dict, dict]:
    """k16 step ks (0..7) of S^T = K Q^T on m16n8k16 bf16: A[(m, k)] -> (token m, dim), B[(k, n)] -> (row n, dim).

    A (16 x 16): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..); B (16 x 8): b0 = (2t..,
    g), b1 = (2t+8.., g). The kernel: a0 / a1 / b0 = word 2 ks of the lane's K rows g / g + 8 and Q row g, a2 / a3 / b1
    = word 2 ks + 1."""
    A, B = {}, {}
    for _, g, t in LANES:
        lo, hi = bf16_word_dims(t, 2 * ks), bf16_word_dims(t, 2 * ks + 1)
        for e in range(2):
            A[(g, 2 * t + e)] = (g, lo[e])
            A[(g + 8, 2 * t + e)] = (g + 8, lo[e])
            A[(g, 2 * t + 8 + e)] = (g, hi[e])
            A[(g + 8, 2 * t + 8 + e)] = (g + 8, hi[e])
            B[(2 * t + e, g)] = (g, lo[e])
            B[(2 * t + 8 + e, g)] = (g, hi[e])
    return A, B


def ldmatrix_v_address(lane: int, j: int) -> tuple[int, int]:
    """(token, logical unit) whose 16 B lane `lane` addresses in the ldmatrix.x4.trans of m-tile j (attention.cu
    tr_pv, BF16): token (lane & 7) + 8 (lane >> 4) of the warp's 16, unit 2j + ((lane >> 3) & 1)."""
    return (lane & 7) + 8 * (lane >> 4), 2 * j + ((lane >> 3) & 1)


def pv_a_slots_bf16(j: int) -> dict:
    """m-tile j of O^T += V^T P^T on BF16: A[(m, k)] -> (head dim, token), from the ldmatrix model: matrix i is
    addressed by lanes 8i..8i+7 (rows = tokens, 8 dims per row) and lands in register i; .trans gives lane (g, t) the
    elements (row 2t, column g) and (row 2t + 1, column g). Registers 0..3 are a0..a3."""
    rows = {}  # matrix i -> its 8 (token, unit) rows, in lane order
    for lane in range(32):
        rows.setdefault(lane >> 3, []).append(ldmatrix_v_address(lane, j))
    A = {}
    slot = {0: (0, 0), 1: (8, 0), 2: (0, 8), 3: (8, 8)}  # register -> (m offset, k offset)
    for _, g, t in LANES:
        for i in range(4):
            mo, ko = slot[i]
            for e in range(2):
                tok, unit = rows[i][2 * t + e]
                A[(g + mo, 2 * t + ko + e)] = (8 * unit + g, tok)
    return A


def merge_store_bf16(j: int, hh: int, g: int) -> int:
    """Head dim of accumulator (m-tile j, c-slot half hh) of lane group g in the BF16 merge store (tr_stage_merge)."""
    return 16 * j + 8 * hh + g


def check_v3_bf16_maps() -> dict:
    """Assert the BF16 transposed-layout fragment maps are consistent (QK k slots meet on one dim, PV rows are one
    dim each with k = token, the merge writes every dim once) and the swizzled shared-memory reads conflict-free;
    returns a few facts. Raises AssertionError."""
    dims = check_qk(qk_slots_bf16, 8, 16)
    # the merge stores m-tile j row m as merge_store_bf16's dim: it must be the row's real dim
    pv_dims = check_pv(pv_a_slots_bf16, lambda j, m: merge_store_bf16(j, m // 8, m % 8))
    # swizzled 256 B rows (unit u of token row r at u ^ (r & 7)); a bank group is the physical unit & 7
    for i in range(4):  # K / Q LDS.128 i: quarter warps (lanes 8q..8q+7: rows g = 2q, 2q + 1, tig 0..3)
        for quarter in range(4):
            groups = {(bf16_units(t)[i] ^ (g & 7)) & 7 for lane, g, t in LANES if lane // 8 == quarter}
            assert len(groups) == 8, ("K/Q load", i, quarter)
    for j in range(8):  # ldmatrix: each 8-lane phase reads 8 rows
        for phase in range(4):
            groups = set()
            for lane in range(8 * phase, 8 * phase + 8):
                tok, unit = ldmatrix_v_address(lane, j)
                groups.add((unit ^ (tok & 7)) & 7)
            assert len(groups) == 8, ("V ldmatrix", j, phase)
    worst = 0  # merge: scalar stores of one instruction (j, hh, c): at most 2 lanes per bank
    for j in range(8):
        for hh in range(2):
            for c in range(2):
                banks: dict = {}
                for _, g, t in LANES:
                    d = merge_store_bf16(j, hh, g)
                    b = (merge_unit(2 * t + c, d >> 2) * 4 + (d & 3)) % 32
                    banks[b] = banks.get(b, 0) + 1
                worst = max(worst, max(banks.values()))
    assert worst <= 2, "merge stores at most 2-way bank conflicts"
    return {"qk_dims_covered": len(dims), "pv_dims_covered": len(pv_dims), "mma_per_warp_tile_qk": 8,
            "mma_per_warp_tile_pv": 8, "merge_store_ways": worst}


# ---- v3w / v3wc3 (attention.cu, attention_wg): FP8 V converted once per tile to f16 in its token-major order (the
# BF16 tile layout below, read by the PV as an MN-major operand); the half-row map ----


def vn_thread_units(tid: int) -> list[tuple[int, int]]:
    """(token t, FP8 16 B unit u) pairs thread tid (0..127) converts in wg_convert_vn: t = (tid & 7) + 8 ((tid >> 3)
    & 7), u = 4 (tid >> 6) + j for j = 0..3 (unit u holds dims 16u..16u+15)."""
    t = (tid & 7) + 8 * ((tid >> 3) & 7)
    return [(t, 4 * (tid >> 6) + j) for j in range(4)]


def vn_store_offset(t: int, c: int) -> int:
    """Byte offset wg_convert_vn stores f16 unit c (dims 8c..8c+7) of token t at: half c >> 3 (kTile * 128 bytes
    apart), unit c & 7 of the half at (c & 7) ^ (t & 7)."""
    return (c >> 3) * (64 * 128) + t * 128 + (((c & 7) ^ (t & 7)) * 16)


def fp8_v_addr(t: int, d: int) -> int:
    """Byte of V[token t][dim d] in the stage's FP8 V tile (128 B rows, unit u of row t at u ^ (t & 7))."""
    return t * 128 + (((d >> 4) ^ (t & 7)) << 4) + (d & 15)


def check_v3w_maps() -> dict:
    """Assert what the warpgroup-MMA kernel's V conversion and row map rely on: every (token, dim) of the FP8 V tile
    is read by one 16 B load of its unit and lands exactly once in the f16 tile, at the place of the BF16 tile layout
    (wg_bf16_unit_offset, whose MN-major PV read check_v3w_bf16_layout checks: the FP8 PV uses the same descriptor);
    each quarter warp's 16 B loads and stores cover 8 distinct bank groups; and the half-row map (rows <= 32: row
    8w + i at M row 16w + i) is a bijection onto the M rows with (m & 15) < 8. Returns a few facts for display.
    Raises AssertionError."""
    f16 = {}
    for tid in range(128):
        for t, u in vn_thread_units(tid):
            load = t * 128 + ((u ^ (t & 7)) << 4)  # the thread's 16 B load: dims 16u..16u+15 of token t
            for k in range(16):
                d = 16 * u + k
                assert fp8_v_addr(t, d) == load + k, ("the load does not hold the dim", tid, t, d)
                addr = vn_store_offset(t, 2 * u + k // 8) + 2 * (k % 8)
                assert addr not in f16, ("f16 element written twice", tid, t, d)
                f16[addr] = (t, d)
    assert len(f16) == 64 * 128, "every (token, dim) converted"
    for addr, (t, d) in f16.items():
        assert addr == wg_bf16_unit_offset(t, d >> 3) + 2 * (d & 7), ("not the BF16 tile layout", t, d)
    for w in range(4):
        for j in range(4):
            for quarter in range(4):
                lanes = [vn_thread_units(32 * w + lane)[j] for lane in range(8 * quarter, 8 * quarter + 8)]
                assert len({(u ^ (t & 7)) & 7 for t, u in lanes}) == 8, ("conversion load conflict", w, j, quarter)
                for c in range(2):
                    groups = {(vn_store_offset(t, 2 * u + c) >> 4) & 7 for t, u in lanes}
                    assert len(groups) == 8, ("conversion store conflict", w, j, quarter, c)
    m_rows = [16 * (r >> 3) + (r & 7) for r in range(32)]
    assert sorted(m_rows) == [m for m in range(64) if (m & 15) < 8], "half-row map"
    return {"converted_elements": len(f16), "loads_per_thread": 4, "stores_per_thread": 8, "m_rows_live": 32}


# The BF16 form of the warpgroup-MMA kernel (v3w with BF16 KV, attention.cu TraitsWg<2, 2, false>). Its loader writes
# 16 B unit ch (dims 8 ch .. 8 ch + 7) of K / V / Q row t at kv_unit_offset(t, ch): the row's two 64-dim halves in two
# [64 rows][128 B] swizzled tiles BF16_HALF bytes apart. The QK reads K and Q through K-major descriptors (one per half,
# k16 step = +32 B), the PV reads V through one MN-major descriptor (leading byte offset = the half stride between the
# two 64-dim N blocks, stride byte offset = 1024 B between 8-token atoms, k16 step = +2048 B).
BF16_HALF = 64 * 128
WG_MN_LBO, WG_MN_SBO, WG_MN_KSTEP = BF16_HALF, 1024, 2048


def wg_bf16_unit_offset(t: int, ch: int) -> int:
    """Byte offset of unit ch (0..15) of row t (0..63) in a BF16 tile of the warpgroup kernel (kv_unit_offset with
    HALF = BF16_HALF)."""
    return (ch >> 3) * BF16_HALF + t * 128 + (((ch & 7) ^ (t & 7)) * 16)


def wg_bf16_thread_rows(tid: int) -> list[tuple[int, int]]:
    """(row, unit) pairs thread tid (0..127) copies of a 64-row BF16 tile, as the one-base loader: unit tid & 15 of
    rows tid >> 4 + 8 i."""
    return [((tid >> 4) + 8 * i, tid & 15) for i in range(8)]


def swizzled_addr(base: int, row: int, col: int) -> int:
    """The 128-byte-swizzle address of 16-bit element col (0..63) of 128-byte row `row`, rows 128 B apart from a
    1024-byte-aligned base: 16 B chunk c at c ^ (row % 8)."""
    return base + row * 128 + ((((col >> 3) ^ (row & 7)) & 7) << 4) + 2 * (col & 7)


def check_v3w_bf16_layout(lbo: int = WG_MN_LBO, sbo: int = WG_MN_SBO, kstep: int = WG_MN_KSTEP) -> dict:
    """Assert what the BF16 warpgroup kernel's operands rely on: the loader's 128 threads write each 16 B unit of a
    64-row tile exactly once, each quarter warp on 8 distinct bank groups; the K-major reads of the QK (half k // 64,
    128 B rows, + 32 B per k16 step) and the MN-major read of the PV (N block n // 64 at lbo, 8-token atom k // 8 at
    sbo, k16 step kk at kstep) find every element where the loader put it. Returns a few facts. Raises
    AssertionError."""
    written = {}
    for tid in range(128):
        for t, ch in wg_bf16_thread_rows(tid):
            off = wg_bf16_unit_offset(t, ch)
            assert off % 16 == 0 and off not in written, ("unit written twice", tid, t, ch)
            written[off] = (t, ch)
    assert sorted(written) == list(range(0, 2 * BF16_HALF, 16)), "the tile's 16 KB covered"
    for i in range(8):  # one-base loader: instruction i of every warp, 8 lanes per 128-byte wavefront
        for w in range(4):
            for quarter in range(4):
                groups = {(wg_bf16_unit_offset(*wg_bf16_thread_rows(32 * w + lane)[i]) >> 4) & 7
                          for lane in range(8 * quarter, 8 * quarter + 8)}
                assert len(groups) == 8, ("loader store conflict", i, w, quarter)

    def loaded(t, d):  # where the loader put element d (0..127) of row t
        return wg_bf16_unit_offset(t, d >> 3) + 2 * (d & 7)

    for t in range(64):  # QK: A / B K-major, k16 step ks reads dims 16 ks .. of every row from half ks // 4
        for d in range(128):
            ks = d // 16
            assert swizzled_addr((ks // 4) * BF16_HALF, t, 16 * (ks % 4) + d % 16) == loaded(t, d), ("QK", t, d)
    for kk in range(4):  # PV: B[k = token 16 kk + k', n = dim] MN-major from base + kk kstep
        for k in range(16):
            for n in range(128):
                base = kk * kstep + (n >> 6) * lbo + (k >> 3) * sbo
                assert swizzled_addr(base, k & 7, n & 63) == loaded(16 * kk + k, n), ("PV", kk, k, n)
    return {"units": len(written), "tile_bytes": 2 * BF16_HALF, "lbo": lbo, "sbo": sbo, "kstep": kstep}
