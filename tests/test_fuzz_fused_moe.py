"""Property-based fuzzing of fused_moe on the CPU: routing plan invariants (every valid (token, slot) placed once,
contiguous ranges, stable order), the plan-driven emulation vs a direct per-token loop, emulation vs exact.
Skipped until the reference module hotpaths.reference.fused_moe is in the tree. Budget: tests/fuzz_profiles.py."""

import pytest

pytest.importorskip("hypothesis", reason="hypothesis (the dev extra) is not installed")
pytest.importorskip("hotpaths.reference.fused_moe",
                    reason="hotpaths.reference.fused_moe (the MoE reference) has not landed in this checkout")

from fuzz_profiles import run_case  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from hotpaths.bench import fused_moe_fuzz as F  # noqa: E402


@given(st.data())
def test_fuzz_fused_moe(data):
    run_case("fused_moe", F, data)
