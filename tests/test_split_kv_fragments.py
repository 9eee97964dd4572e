"""CPU checks of the v3 decode kernel's fragment index model (hotpaths.kernels.split_kv_decode.fragments)."""

from __future__ import annotations

import pytest

from hotpaths.kernels.split_kv_decode import fragments as F


def test_v3_maps_consistent():
    facts = F.check_v3_maps()
    assert facts["qk_dims_covered"] == 128 and facts["pv_dims_covered"] == 128


def test_p_transpose_is_pv_b_fragment():
    m = F.p_transpose()
    assert m[0] == ((0, 0), (1, 0)) and m[5] == ((2, 1), (3, 1)) and m[31] == ((6, 7), (7, 7))


@pytest.mark.parametrize("broken", ["merge_identity", "qk_word_swap", "pv_wrong_word"])
def test_check_catches_a_wrong_map(monkeypatch, broken):
    """Each map the kernel relies on, broken on purpose, makes the check fail (so the check can fail)."""
    if broken == "merge_identity":  # unswizzled merge rows: quarter-warp stores collide on bank groups
        monkeypatch.setattr(F, "merge_unit", lambda r, u: u)
    elif broken == "qk_word_swap":  # B side reads the other word of the pair than A: dims no longer meet
        real = F.qk_slots

        def swapped(ks):
            A, B = real(ks)
            return A, {(k, n): (row, d ^ 4) for (k, n), (row, d) in B.items()}
        monkeypatch.setattr(F, "qk_slots", swapped)
    else:  # rows g + 8 reading word wq instead of wq + 2: a head dim covered twice, another never
        real = F.pv_a_slots

        def wrong(j):
            return {(m, k): ((d - 8) if m >= 8 else d, tok) for (m, k), (d, tok) in real(j).items()}
        monkeypatch.setattr(F, "pv_a_slots", wrong)
    with pytest.raises(AssertionError):
        F.check_v3_maps()


def test_v3_bf16_maps_consistent():
    """The BF16 transposed layout's fragments: QK k slots meet on one head dim and cover all 128, ldmatrix.trans of V
    gives m-tile j row m the dim the merge stores it as, the swizzled reads are conflict-free."""
    facts = F.check_v3_bf16_maps()
    assert facts["qk_dims_covered"] == 128 and facts["pv_dims_covered"] == 128 and facts["merge_store_ways"] <= 2
    assert F.ldmatrix_v_address(0, 0) == (0, 0) and F.ldmatrix_v_address(9, 3) == (1, 7)
    assert F.ldmatrix_v_address(31, 7) == (15, 15)


@pytest.mark.parametrize("broken", ["merge_dim", "ldmatrix_half", "q_units", "repeated_units"])
def test_bf16_check_catches_a_wrong_map(monkeypatch, broken):
    """Each BF16 map broken on purpose makes check_v3_bf16_maps fail."""
    if broken == "merge_dim":  # storing m-tile j's rows as dims 16 g + j (the FP8 map) instead of 16 j + g
        monkeypatch.setattr(F, "merge_store_bf16", lambda j, hh, g: 16 * g + 8 * hh + j if g < 8 else 0)
    elif broken == "ldmatrix_half":  # lanes 8..15 addressing the low 8 dims: a1 repeats a0's dims
        monkeypatch.setattr(F, "ldmatrix_v_address", lambda lane, j: ((lane & 7) + 8 * (lane >> 4), 2 * j))
    elif broken == "q_units":  # the B side (Q) reading units 4t..4t+3 while A (K) reads 2t, 2t+1, 2t+8, 2t+9
        real = F.qk_slots_bf16

        def other(ks):
            A, B = real(ks)
            return A, {(k, n): (row, (d + 16) % 128) for (k, n), (row, d) in B.items()}
        monkeypatch.setattr(F, "qk_slots_bf16", other)
    else:  # a lane loading one unit twice: half the head dims never meet in QK
        monkeypatch.setattr(F, "bf16_units", lambda t: [2 * t, 2 * t, 2 * t + 8, 2 * t + 8])
    with pytest.raises(AssertionError):
        F.check_v3_bf16_maps()


def test_v3w_maps_consistent():
    """The warpgroup-MMA kernel's V conversion writes every element of the FP8 V tile exactly once into the f16 tile
    at the BF16 tile's place (the MN-major layout the PV reads), with conflict-free loads and stores, and its
    half-row map puts the 32 live rows on the first 8 rows of each warp's 16."""
    facts = F.check_v3w_maps()
    assert facts["converted_elements"] == 8192 and facts["loads_per_thread"] == 4
    assert F.vn_thread_units(0) == [(0, 0), (0, 1), (0, 2), (0, 3)]
    assert F.vn_thread_units(127) == [(63, 4), (63, 5), (63, 6), (63, 7)]


@pytest.mark.parametrize("broken", ["no_swizzle", "halves_adjacent", "thread_map"])
def test_v3w_check_catches_a_wrong_map(monkeypatch, broken):
    """Each v3w map broken on purpose makes check_v3w_maps fail."""
    if broken == "no_swizzle":  # f16 rows unswizzled: not the layout the MN-major descriptor reads
        monkeypatch.setattr(F, "vn_store_offset", lambda t, c: (c >> 3) * 8192 + t * 128 + (c & 7) * 16)
    elif broken == "halves_adjacent":  # 256-byte f16 rows: the two 64-dim halves are not 8 KB apart
        monkeypatch.setattr(F, "vn_store_offset", lambda t, c: t * 256 + ((c ^ (t & 7)) * 16))
    else:  # a quarter warp on the 8 units of one token: its stores hit 4 bank groups
        monkeypatch.setattr(F, "vn_thread_units", lambda tid: [(tid >> 1, 4 * (tid & 1) + j) for j in range(4)])
    with pytest.raises(AssertionError):
        F.check_v3w_maps()


def test_v3w_bf16_layout_consistent():
    """The BF16 warpgroup kernel's loader covers a 64-row tile's 16 KB once, conflict-free per quarter warp, and the
    QK's K-major reads and the PV's MN-major read (leading byte offset = the 64-dim half stride, stride byte offset =
    one 1024-byte atom, 2 KB per k16 step) find each element where the loader wrote it."""
    facts = F.check_v3w_bf16_layout()
    assert facts == {"units": 1024, "tile_bytes": 16384, "lbo": 8192, "sbo": 1024, "kstep": 2048}
    assert F.wg_bf16_unit_offset(0, 8) == 8192 and F.wg_bf16_unit_offset(9, 1) == 9 * 128 + 0 * 16


@pytest.mark.parametrize("broken", ["lbo_sbo_swapped", "kstep", "no_swizzle", "thread_map"])
def test_v3w_bf16_check_catches_a_wrong_layout(monkeypatch, broken):
    """Each part of the BF16 layout broken on purpose makes check_v3w_bf16_layout fail: the descriptor's two offsets
    swapped (the reading for K-major operands), a k16 step of one atom, unswizzled rows, lanes on rows 8 apart."""
    kw = {}
    if broken == "lbo_sbo_swapped":
        kw = dict(lbo=1024, sbo=8192)
    elif broken == "kstep":
        kw = dict(kstep=1024)
    elif broken == "no_swizzle":
        monkeypatch.setattr(F, "wg_bf16_unit_offset", lambda t, ch: (ch >> 3) * F.BF16_HALF + t * 128 + (ch & 7) * 16)
    else:  # a quarter warp down one unit of rows 8 apart (all with row % 8 == i): one bank group, 8-way conflict
        monkeypatch.setattr(F, "wg_bf16_thread_rows", lambda tid: [(8 * (tid & 7) + i, tid >> 3) for i in range(8)])
    with pytest.raises(AssertionError):
        F.check_v3w_bf16_layout(**kw)
