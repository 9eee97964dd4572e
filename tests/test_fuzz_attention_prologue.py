"""Property-based fuzzing of attention_prologue on the CPU: hypothesis shrinks a failure to its minimal
configuration; the assertion prints it as a `hotpaths fuzz --op attention_prologue --config ...` command.
Budget: tests/fuzz_profiles.py."""

import pytest

pytest.importorskip("hypothesis", reason="hypothesis (the dev extra) is not installed")

from fuzz_profiles import run_case  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from hotpaths.bench import attention_prologue_fuzz as F  # noqa: E402


@given(st.data())
def test_fuzz_attention_prologue(data):
    run_case("attention_prologue", F, data)
