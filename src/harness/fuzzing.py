"""Generic fuzzing machinery (knows no op): a draw interface both numpy seeds and hypothesis can drive, guarded
buffers (canaries before and after every output, workspace and cache), and the sweep loop.

An op's fuzz module (``hotpaths.bench.<op>_fuzz``) writes ``fuzz_case(draw, kernel=...) -> dict`` against
``Draw`` so the same generator serves the CPU property tests (hypothesis shrinks the draws) and the GPU sweep (a
seeded numpy generator), and ``fuzz_run(cfg) -> dict`` returning ``{"failures": [str, ...], ...}``.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence

import numpy as np

GUARD_BYTES = 512      # canary bytes on each side of a guarded buffer (a multiple of 256: keeps the view aligned)
GUARD_PATTERN = 0xA5   # not 0x00, 0xFF, 0x7F (e4m3 NaN) or a small int: a stray write of any usual value shows


class Draw:
    """The draws a fuzz case is built from. ``integer(lo, hi)`` is inclusive; ``choice(seq)`` returns an element of
    seq (a plain Python value); ``boolean()``. Subclasses bind it to a numpy generator or to hypothesis."""

    def integer(self, lo: int, hi: int) -> int:
        raise NotImplementedError

    def choice(self, seq: Sequence):
        return seq[self.integer(0, len(seq) - 1)]

    def boolean(self) -> bool:
        return bool(self.integer(0, 1))


class NumpyDraw(Draw):
    """Draws from ``np.random.default_rng(seed)``: the GPU sweep's reproducible stream."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    def integer(self, lo: int, hi: int) -> int:
        if hi < lo:
            raise ValueError(f"integer: empty range [{lo}, {hi}]")
        return int(self.rng.integers(lo, hi + 1))


class HypothesisDraw(Draw):
    """Draws through hypothesis' ``data.draw`` so a failing case shrinks (small integers, first choices)."""

    def __init__(self, data):
        self.data = data

    def integer(self, lo: int, hi: int) -> int:
        from hypothesis import strategies as st

        return self.data.draw(st.integers(lo, hi))

    def choice(self, seq: Sequence):
        from hypothesis import strategies as st

        return self.data.draw(st.sampled_from(list(seq)))


def config_json(cfg: dict) -> str:
    """The config as one compact JSON string (the ``--config`` argument of the repro command)."""
    return json.dumps(cfg, sort_keys=True, separators=(",", ":"))


def repro_command(op: str, cfg: dict) -> str:
    """``hotpaths fuzz --op OP --config '<json>'``: re-runs exactly this case."""
    return f"hotpaths fuzz --op {op} --config '{config_json(cfg)}'"


# ----------------------------------------------------------------------------------------------------------------
# guarded buffers

class GuardedBuffers:
    """Tensors allocated inside a larger byte buffer with GUARD_BYTES of GUARD_PATTERN before and after.

    ``alloc(name, shape, dtype, device, fill=None)`` returns the view (optionally filled: a poison value or a
    tensor to copy); ``adopt(name, t)`` allocates a guarded copy of t. ``violations()`` lists every buffer whose
    guard bytes changed (a write outside the tensor), with the first bad offset.
    """

    def __init__(self, guard: int = GUARD_BYTES, pattern: int = GUARD_PATTERN):
        if guard % 256:
            raise ValueError(f"guard: expected a multiple of 256 bytes (keeps views aligned), got {guard}")
        self.guard, self.pattern = guard, pattern
        self._bufs: dict[str, tuple] = {}

    def alloc(self, name: str, shape, dtype, device, fill=None):
        import torch

        if name in self._bufs:
            raise ValueError(f"name: {name!r} is already allocated")
        numel = int(np.prod(shape)) if len(shape) else 1
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        raw = torch.full((nbytes + 2 * self.guard,), self.pattern, dtype=torch.uint8, device=device)
        view = raw[self.guard:self.guard + nbytes].view(dtype).view(*shape)
        if fill is not None:
            if isinstance(fill, torch.Tensor):
                view.copy_(fill)
            else:
                view.fill_(fill)
        self._bufs[name] = (raw, nbytes)
        return view

    def adopt(self, name: str, t):
        return self.alloc(name, tuple(t.shape), t.dtype, t.device, fill=t)

    def violations(self) -> list[str]:
        bad = []
        for name, (raw, nbytes) in self._bufs.items():
            for side, seg in (("before", raw[:self.guard]), ("after", raw[self.guard + nbytes:])):
                diff = (seg != self.pattern).nonzero()
                if diff.numel():
                    i = int(diff[0, 0]) if side == "after" else int(diff[-1, 0])
                    where = f"{i} bytes past its end" if side == "after" else f"{self.guard - i} bytes before its start"
                    bad.append(f"{name}: guard {side} the buffer overwritten ({int(diff.shape[0])} bytes; nearest "
                               f"{where}, value 0x{int(seg[i]):02x})")
        return bad


def unchanged(before, after, mask=None, *, name: str) -> list[str]:
    """Bytes of ``after`` that differ from ``before`` where ``mask`` (broadcast over trailing dims; None = all) is
    True: slots the op must not write."""
    import torch

    if before.numel() == 0:
        return []
    if REF_DEVICE == "cpu":  # under compute-sanitizer: compare on the host, so no library kernel runs instrumented
        before, after = before.cpu(), after.cpu()
    b = before.detach().contiguous().view(torch.uint8).reshape(before.shape[0], -1) if before.dim() else before
    a = after.detach().contiguous().view(torch.uint8).reshape(after.shape[0], -1) if after.dim() else after
    diff = (a != b).any(dim=1) if a.dim() == 2 else (a != b)
    if mask is not None:
        diff = diff & mask.to(diff.device)
    n = int(diff.sum())
    if n:
        first = int(diff.nonzero()[0, 0])
        return [f"{name}: {n} rows the op must not write were changed (first: row {first})"]
    return []


# ----------------------------------------------------------------------------------------------------------------
# the sweep

def sweep(op: str, fuzz_case: Callable, fuzz_run: Callable, *, n: int, seed: int, kernel: bool,
          progress: Callable[[str], None] | None = None) -> list[dict]:
    """Draw ``n`` cases from ``fuzz_case(NumpyDraw(rng), kernel=kernel)`` with rng seeded by ``seed``, run each with
    ``fuzz_run(cfg)`` and return one row per case: case index, the config, status ("ok", "fail" or "error" for an
    exception), the failures joined, seconds, the repro command, and ``metrics`` (compact JSON of the runner's
    ``metrics`` dict, the measured errors its checks compared; empty where it returns none). An exception is a
    failure of the case, never of the sweep."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        cfg = fuzz_case(NumpyDraw(rng), kernel=kernel)
        t0 = time.perf_counter()
        try:
            res = fuzz_run(cfg) or {}
            fails = list(res.get("failures", []))
            status = "fail" if fails else "ok"
            path, metrics = res.get("path", ""), res.get("metrics")
        except Exception as exc:  # noqa: BLE001 - a crash of one case is that case's failure
            fails, status, path, metrics = [f"{type(exc).__name__}: {exc}"], "error", "", None
        row = {"op": op, "case": i, "seed": seed, "path": path, "status": status,
               "failures": "; ".join(fails), "seconds": round(time.perf_counter() - t0, 4),
               "config": config_json(cfg), "repro": repro_command(op, cfg) if fails else "",
               "metrics": _metrics_json(metrics)}
        rows.append(row)
        if progress is not None and fails:
            progress(f"{op} case {i}: {status}: {row['failures']}\n  repro: {row['repro']}")
    return rows


def _metrics_json(metrics: dict | None) -> str:
    """Compact JSON of a runner's metrics (floats to 4 significant digits), "" for None."""
    if not metrics:
        return ""
    return json.dumps({k: (float(f"{v:.4g}") if isinstance(v, float) else v) for k, v in metrics.items()},
                      separators=(",", ":"))


def summary(rows: list[dict]) -> dict:
    """Cases tried and failed, per op."""
    out: dict = {}
    for r in rows:
        s = out.setdefault(r["op"], {"op": r["op"], "tried": 0, "failed": 0})
        s["tried"] += 1
        s["failed"] += r["status"] != "ok"
    return out


# ----------------------------------------------------------------------------------------------------------------
# compute-sanitizer logs

# Where the fuzz runners compute their reference results: "cuda" (fast) or "cpu" (under compute-sanitizer, so that
# only the op's own launches and a few copies run instrumented).
REF_DEVICE = "cuda"

CASE_MARK = "hotpaths-sanitize-case"  # the driver prints "<CASE_MARK> <op> <index>" before each case
# memcheck/synccheck/initcheck end with "ERROR SUMMARY: N errors"; racecheck with "RACECHECK SUMMARY: H hazards
# displayed (N errors, W warnings)" (warnings are benign orderings it cannot prove; errors are hazards).
_SUMMARY = re.compile(r"^=+ (?:ERROR SUMMARY: (\d+) errors?|RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) errors?)",
                      re.M)
_NOT_REPORTS = ("ERROR SUMMARY", "COMPUTE-SANITIZER", "RACECHECK SUMMARY", "LEAK SUMMARY", "Target application")
# A report naming only these is in a library kernel the driver's own checks launch (PyTorch reductions and copies
# on the guard buffers), not in an op's kernel: counted apart, so a library's report neither hides nor fakes ours.
LIBRARY_KERNELS = ("at::native::", "at::cuda::", "c10::", "_ZN2at6native", "_ZN3c10")


def parse_sanitizer_log(text: str) -> dict:
    """Parse one compute-sanitizer run of the sanitize driver: ``summary`` (the tool's error count, None when it
    printed no summary: it refused or died), ``per_case`` {case index: reports in our kernels} and
    ``per_case_library`` {case index: reports in library kernels (PyTorch)}, attributed to the last case marker
    before them (a report = a '========= X...' line not indented plus its indented lines), ``library`` (their
    total), ``first`` / ``first_library`` (the first report line in our / library kernels, '' when none) and
    ``case_status`` {case index: the driver's ok/FAIL line}."""
    m = _SUMMARY.findall(text)
    summary = int(next(g for g in m[-1] if g)) if m else None
    per_case: dict = {}
    per_lib: dict = {}
    status: dict = {}
    reports: list = []  # [case, [lines]]
    case = None
    for line in text.splitlines():
        if line.startswith(CASE_MARK):
            case = int(line.split()[-1])
            per_case.setdefault(case, 0)
            per_lib.setdefault(case, 0)
            continue
        if line.startswith("sanitize ") and " case " in line and case is not None:
            status[case] = line.split(": ", 1)[-1]
        if line.startswith("=========  ") and reports:
            reports[-1][1].append(line)
        elif line.startswith("========= ") and not any(k in line for k in _NOT_REPORTS):
            reports.append([case, [line]])
    first, first_library, library = "", "", 0
    for c, lines in reports:
        body = "\n".join(lines)
        lib = any(k in body for k in LIBRARY_KERNELS)
        library += lib
        if c is not None:
            (per_lib if lib else per_case)[c] = (per_lib if lib else per_case).get(c, 0) + 1
        if lib:
            first_library = first_library or lines[0][10:].strip()
        else:
            first = first or lines[0][10:].strip()
    return {"summary": summary, "per_case": per_case, "per_case_library": per_lib, "library": library,
            "first": first, "first_library": first_library, "case_status": status}
