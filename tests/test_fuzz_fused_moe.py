"""Property-based fuzzing of fused_moe on the CPU: routing plan invariants (every valid (token, slot) placed once,
contiguous ranges, stable order), the plan-driven emulation vs a direct per-token loop, emulation vs exact.
Budget: tests/fuzz_profiles.py."""

from fuzz_profiles import fuzz_test

test_fuzz_fused_moe = fuzz_test("fused_moe")
