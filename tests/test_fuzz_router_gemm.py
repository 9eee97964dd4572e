"""Property-based fuzzing of router_gemm on the CPU: hypothesis shrinks a failure to its minimal
configuration; the assertion prints it as a `hotpaths fuzz --op router_gemm --config ...` command.
Budget: tests/fuzz_profiles.py."""

import pytest

pytest.importorskip("hypothesis", reason="hypothesis (the dev extra) is not installed")

from fuzz_profiles import run_case  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from hotpaths.bench import router_gemm_fuzz as F  # noqa: E402


@given(st.data())
def test_fuzz_router_gemm(data):
    run_case("router_gemm", F, data)
