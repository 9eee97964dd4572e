"""Re-export of the one tensor validator (it lives in the bottom layer, hotpaths.reference.common)."""

from hotpaths.reference.common import check_fits, expect_tensor  # noqa: F401
