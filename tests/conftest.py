"""Shared test setup: GPU tests carry ``@pytest.mark.gpu`` and skip without SM90, with the reason."""

import pytest

from hotpaths.harness.env import sm90_skip_reason


def pytest_collection_modifyitems(config, items):
    reason = sm90_skip_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
