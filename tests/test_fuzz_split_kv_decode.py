"""Property-based fuzzing of split_kv_decode on the CPU: hypothesis shrinks a failure to its minimal
configuration; the assertion prints it as a `hotpaths fuzz --op split_kv_decode --config ...` command.
Budget: tests/fuzz_profiles.py."""

import pytest

pytest.importorskip("hypothesis", reason="hypothesis (the dev extra) is not installed")

from fuzz_profiles import run_case  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from hotpaths.bench import split_kv_decode_fuzz as F  # noqa: E402


@given(st.data())
def test_fuzz_split_kv_decode(data):
    run_case("split_kv_decode", F, data)
