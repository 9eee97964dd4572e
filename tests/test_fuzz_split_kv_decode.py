"""Property-based fuzzing of split_kv_decode on the CPU: hypothesis shrinks a failure to its minimal
configuration; the assertion prints it as a `hotpaths fuzz --op split_kv_decode --config ...` command.
Budget: tests/fuzz_profiles.py."""

from fuzz_profiles import run_case
from hypothesis import given
from hypothesis import strategies as st

from hotpaths.bench import split_kv_decode_fuzz as F


@given(st.data())
def test_fuzz_split_kv_decode(data):
    run_case("split_kv_decode", F, data)
