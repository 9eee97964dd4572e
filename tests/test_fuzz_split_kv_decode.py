"""Property-based fuzzing of split_kv_decode on the CPU: hypothesis shrinks a failure to its minimal
configuration; the assertion prints it as a `hotpaths fuzz --op split_kv_decode --config ...` command.
Budget: tests/fuzz_profiles.py."""

from fuzz_profiles import fuzz_test

test_fuzz_split_kv_decode = fuzz_test("split_kv_decode")
