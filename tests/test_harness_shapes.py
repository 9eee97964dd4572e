import pytest

from hotpaths.harness.shapes import CaseError, expand_lengths, format_case, parse_cases, parse_int_list

PUBLISHED = ["64x0.5K", "64x4K", "32x0.125K+32x4K", "2x32K+30x4K", "1x64K+15x4K", "1x128K+31x4K",
             "1x16K+15x64", "1x64K+7x4K", "1x64K+31x4K"]


def test_parse_examples():
    assert parse_cases("1x128K+31x4K") == [(1, 131072), (31, 4096)]
    assert parse_cases("32x0.125K+32x4K") == [(32, 128), (32, 4096)]
    assert parse_cases("1x16K+15x64") == [(1, 16384), (15, 64)]
    assert parse_cases("4x0") == [(4, 0)]
    assert parse_cases(" 2x1k ") == [(2, 1024)]


@pytest.mark.parametrize("case", PUBLISHED)
def test_round_trip(case):
    assert format_case(parse_cases(case)) == case


def test_expand_lengths():
    lengths = expand_lengths("1x64K+7x4K")
    assert lengths == [65536] + [4096] * 7
    assert sum(expand_lengths("64x0.5K")) == 64 * 512


@pytest.mark.parametrize("bad,needle", [("3y4K", "'3y4K'"), ("", "empty"), ("0x4K", "zero request count"),
                                        ("4x1.1", "not a whole number"), ("4x4K+", "''"), ("x4K", "'x4K'"),
                                        ("4x-1", "'4x-1'"), ("4x4M", "'4x4M'")])
def test_malformed_cases_name_the_term(bad, needle):
    with pytest.raises(CaseError) as e:
        parse_cases(bad)
    assert needle in str(e.value)


def test_int_list():
    assert parse_int_list("1,2, 4", "--m") == [1, 2, 4]
    with pytest.raises(CaseError, match="--m"):
        parse_int_list("1,a", "--m")
    with pytest.raises(CaseError):
        parse_int_list("-1", "--m")
