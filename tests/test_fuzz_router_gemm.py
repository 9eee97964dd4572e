"""Property-based fuzzing of router_gemm on the CPU: hypothesis shrinks a failure to its minimal
configuration; the assertion prints it as a `hotpaths fuzz --op router_gemm --config ...` command.
Budget: tests/fuzz_profiles.py."""

from fuzz_profiles import run_case
from hypothesis import given
from hypothesis import strategies as st

from hotpaths.bench import router_gemm_fuzz as F


@given(st.data())
def test_fuzz_router_gemm(data):
    run_case("router_gemm", F, data)
