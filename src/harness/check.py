"""Correctness metrics against a higher-precision reference, and the one assertion every test uses."""

from __future__ import annotations

from dataclasses import dataclass

from hotpaths.harness.tolerances import Tolerance, tolerance


@dataclass
class CheckResult:
    rel_l2_err: float
    max_abs_err: float
    cosine: float
    nan_count: int
    inf_count: int
    numel: int
    passed: bool
    tolerance: Tolerance | None

    def as_row(self) -> dict:
        """The table columns this check fills."""
        return {"rel_l2_err": self.rel_l2_err, "max_abs_err": self.max_abs_err, "cosine": self.cosine}

    def __str__(self) -> str:
        tol = self.tolerance
        lim = f" (limit rel_l2 {tol.rel_l2:g}" + (f", max_abs {tol.max_abs:g}" if tol and tol.max_abs is not None
                                                  else "") + ")" if tol else ""
        return (f"{'PASS' if self.passed else 'FAIL'}: rel_l2={self.rel_l2_err:.3e} max_abs={self.max_abs_err:.3e} "
                f"cosine={self.cosine:.6f} nan={self.nan_count} inf={self.inf_count}{lim}")


def check(out, ref, *, op: str | None = None, path: str | None = None, tol: Tolerance | None = None) -> CheckResult:
    """Compare ``out`` with ``ref`` (any shape, same numel; any float dtype; compared in float64 on ref's device).

    NaN/Inf in ``out`` fail regardless of tolerance. With neither (op, path) nor tol, ``passed`` is the NaN/Inf test
    only. Raises ValueError on a shape mismatch.
    """
    import torch

    if tuple(out.shape) != tuple(ref.shape):
        raise ValueError(f"out: expected shape {tuple(ref.shape)} like ref, got {tuple(out.shape)}")
    if tol is None and op is not None:
        tol = tolerance(op, path)
    o = out.detach().to(device=ref.device, dtype=torch.float64).flatten()
    r = ref.detach().to(torch.float64).flatten()
    nan = int(torch.isnan(o).sum())
    inf = int(torch.isinf(o).sum())
    finite = torch.isfinite(o)
    diff = torch.where(finite, o - r, torch.zeros_like(o))
    rnorm = float(torch.linalg.vector_norm(r))
    dnorm = float(torch.linalg.vector_norm(diff))
    rel = dnorm / rnorm if rnorm > 0 else (0.0 if dnorm == 0 else float("inf"))
    max_abs = float(diff.abs().max()) if diff.numel() else 0.0
    onorm = float(torch.linalg.vector_norm(torch.where(finite, o, torch.zeros_like(o))))
    cos = float(torch.dot(torch.where(finite, o, torch.zeros_like(o)), r) / (onorm * rnorm)) if onorm * rnorm > 0 \
        else (1.0 if onorm == rnorm else 0.0)
    if nan or inf:
        rel, max_abs = float("nan"), float("nan")
    ok = nan == 0 and inf == 0
    if tol is not None and ok:
        ok = rel <= tol.rel_l2 and (tol.max_abs is None or max_abs <= tol.max_abs) and \
            (tol.min_cosine is None or cos >= tol.min_cosine)
    return CheckResult(rel, max_abs, cos, nan, inf, o.numel(), ok, tol)


def topk_error_table(out, ref, k: int = 10) -> str:
    """The k worst elements (index, out, ref, |diff|), NaN first: printed when a check fails."""
    import torch

    o = out.detach().to(device=ref.device, dtype=torch.float64).flatten()
    r = ref.detach().to(torch.float64).flatten()
    d = (o - r).abs()
    d = torch.where(torch.isnan(d), torch.full_like(d, float("inf")), d)
    k = min(k, d.numel())
    vals, idx = torch.topk(d, k)
    lines = [f"{'flat index':>12} {'multi-index':>20} {'out':>14} {'ref':>14} {'|diff|':>12}"]
    for i in idx.tolist():
        mi = tuple(int(v) for v in torch.unravel_index(torch.tensor(i), tuple(out.shape)))
        d = (o[i] - r[i]).abs().item()
        lines.append(f"{i:>12} {str(mi):>20} {o[i].item():>14.6g} {r[i].item():>14.6g} {d:>12.4g}")
    return "\n".join(lines)


def assert_close(out, ref, *, op: str | None = None, path: str | None = None, tol: Tolerance | None = None,
                 what: str = "") -> CheckResult:
    """check() that raises AssertionError with the metrics and a top-k error table on failure."""
    res = check(out, ref, op=op, path=path, tol=tol)
    if not res.passed:
        raise AssertionError(f"{what or (op, path)}: {res}\n{topk_error_table(out, ref)}")
    return res
