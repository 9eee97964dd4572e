"""The one tolerance table, keyed by (op, precision path).

Kernel-vs-emulation rows are tight (same arithmetic, different summation order); kernel-vs-exact rows are derived
from the measured emulation-vs-exact error (see each op's notebook for the measurement) with headroom. NaN or Inf
in an output never passes, whatever the row says.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tolerance:
    rel_l2: float
    max_abs: float | None = None
    min_cosine: float | None = None


TOLERANCES: dict[tuple[str, str], Tolerance] = {
    # probe: a copy is exact
    ("probe", "exact"): Tolerance(rel_l2=0.0, max_abs=0.0),
    # split_kv_decode
    ("split_kv_decode", "bf16_vs_exact"): Tolerance(rel_l2=1e-2, max_abs=5e-2, min_cosine=0.9999),
    ("split_kv_decode", "fp8_vs_exact"): Tolerance(rel_l2=1e-2, max_abs=5e-2, min_cosine=0.9999),
    ("split_kv_decode", "bf16_vs_emulation"): Tolerance(rel_l2=8e-3, max_abs=3e-2, min_cosine=0.9999),
    ("split_kv_decode", "fp8_vs_emulation"): Tolerance(rel_l2=8e-3, max_abs=3e-2, min_cosine=0.9999),
    # router_gemm: scores vs FP64
    ("router_gemm", "bf16x2_vs_emulation"): Tolerance(rel_l2=1e-5, max_abs=1e-4),
    ("router_gemm", "bf16x2_vs_exact"): Tolerance(rel_l2=1e-4, max_abs=5e-3),
    ("router_gemm", "bf16x3_vs_exact"): Tolerance(rel_l2=1e-5, max_abs=1e-3),
    ("router_gemm", "tf32_vs_exact"): Tolerance(rel_l2=5e-3, max_abs=2e-1),
    ("router_gemm", "bf16_vs_exact"): Tolerance(rel_l2=2e-2, max_abs=5e-1),
}


def tolerance(op: str, path: str) -> Tolerance:
    """Look up the row for (op, path); KeyError lists the known paths of that op."""
    try:
        return TOLERANCES[(op, path)]
    except KeyError:
        known = sorted(p for o, p in TOLERANCES if o == op)
        raise KeyError(f"no tolerance for op={op!r} path={path!r}; known paths for this op: {known}") from None
