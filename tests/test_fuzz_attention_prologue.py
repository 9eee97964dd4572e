"""Property-based fuzzing of attention_prologue on the CPU: hypothesis shrinks a failure to its minimal
configuration; the assertion prints it as a `hotpaths fuzz --op attention_prologue --config ...` command.
Budget: tests/fuzz_profiles.py."""

from fuzz_profiles import run_case
from hypothesis import given
from hypothesis import strategies as st

from hotpaths.bench import attention_prologue_fuzz as F


@given(st.data())
def test_fuzz_attention_prologue(data):
    run_case("attention_prologue", F, data)
