"""Property-based fuzzing of router_gemm on the CPU: hypothesis shrinks a failure to its minimal
configuration; the assertion prints it as a `hotpaths fuzz --op router_gemm --config ...` command.
Budget: tests/fuzz_profiles.py."""

from fuzz_profiles import fuzz_test

test_fuzz_router_gemm = fuzz_test("router_gemm")
