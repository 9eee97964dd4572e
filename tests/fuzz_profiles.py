"""Hypothesis settings of the fuzz tests (tests/test_fuzz_*.py): profile "ci" (default) is a fixed, derandomized
example budget (all four fuzz files in about a minute on two busy cores, measured); HYPOTHESIS_PROFILE=long draws many
more cases with a random seed for local runs. No deadline: a case's time depends on its drawn sizes."""

import importlib
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

CI_EXAMPLES = 300
settings.register_profile("ci", max_examples=CI_EXAMPLES, deadline=None, derandomize=True, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("long", max_examples=2000, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def run_case(op: str, mod, data):
    """Draw one configuration through hypothesis, run the op's CPU checks, fail with the repro command."""
    from hypothesis import event, note

    from hotpaths.harness.fuzzing import HypothesisDraw, repro_command

    cfg = mod.fuzz_case(HypothesisDraw(data), kernel=False)
    cmd = repro_command(op, cfg)
    note(f"repro: {cmd}")
    fails = mod.check_cpu(cfg)["failures"]
    event("failed" if fails else "passed")
    assert not fails, "\n".join(fails) + f"\nrepro: {cmd}"


def fuzz_test(op: str):
    """The fuzz test of one op (each tests/test_fuzz_<op>.py binds it to a test_ name): hypothesis draws the
    configuration, run_case checks it against hotpaths.bench.<op>_fuzz's CPU checks."""
    mod = importlib.import_module(f"hotpaths.bench.{op}_fuzz")

    @given(st.data())
    def test(data):
        run_case(op, mod, data)

    test.__name__ = f"test_fuzz_{op}"
    return test
