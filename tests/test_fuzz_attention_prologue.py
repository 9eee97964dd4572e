"""Property-based fuzzing of attention_prologue on the CPU: hypothesis shrinks a failure to its minimal
configuration; the assertion prints it as a `hotpaths fuzz --op attention_prologue --config ...` command.
Budget: tests/fuzz_profiles.py."""

from fuzz_profiles import fuzz_test

test_fuzz_attention_prologue = fuzz_test("attention_prologue")
