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
