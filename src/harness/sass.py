"""SASS of a built kernel, read without a GPU: cuobjdump's disassembly of ``lib<op>.so``, parsed into instructions,
the loops found by their backward branches, and the instruction mix of a function or of one loop.

Why: Nsight Compute says how a kernel spends its cycles on the GPU; the SASS says what ptxas made of the source on
any machine with the CUDA toolkit's compiler. A change meant to shorten a main loop can be checked here before a GPU
run (the design notes quote such counts: docs/ops/split_kv_decode.md). Counts are static, every instruction of the
loop's address range once, including its rarely taken branches; Nsight Compute's source page gives the executed
counts.

cuobjdump (and the nvdisasm it calls) come from the ``nvidia-cuda-cuobjdump`` and ``nvidia-cuda-nvdisasm`` wheels
(``make setup`` installs both), a CUDA toolkit, or ``$HOTPATHS_CUOBJDUMP``::

    hotpaths sass split_kv_decode --kernel 'TraitsWgILi3ELi2' --loop
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

# Instruction families by what they occupy (the first dotted part of the opcode).
GROUPS = {
    "tensor": {"HGMMA", "QGMMA", "IGMMA", "BGMMA", "HMMA", "IMMA", "QMMA"},
    "memory": {"LDG", "STG", "LDS", "STS", "LDGSTS", "LDSM", "STSM", "LD", "ST", "LDC", "ULDC", "ATOM", "ATOMS",
               "RED", "UTMALDG", "UTMASTG", "UBLKCP", "LDGDEPBAR", "CCTL", "SHFL"},
    "sync": {"BAR", "DEPBAR", "WARPGROUP", "MEMBAR", "FENCE", "SYNCS", "ERRBAR", "ARRIVES", "UCGABAR_ARV",
             "UCGABAR_WAIT", "CGAERRBAR"},
    "control": {"BRA", "BSSY", "BSYNC", "WARPSYNC", "EXIT", "RET", "CALL", "YIELD", "NOP", "BPT", "JMP", "BREAK",
                "ACQBULK", "ELECT", "VOTE", "VOTEU"},
    "float": {"FADD", "FMUL", "FFMA", "FMNMX", "MUFU", "F2FP", "FSEL", "FSETP", "FCHK", "HADD2", "HMUL2", "HFMA2",
              "HMNMX2", "F2F", "F2I", "I2F", "FRND", "FSWZADD", "DADD", "DMUL", "DFMA"},
}


def group_of(family: str) -> str:
    """The GROUPS key of an opcode family; "integer" for the rest (IMAD, IADD3, LOP3, SHF, LEA, ISETP, SEL, PRMT,
    MOV, R2UR, S2R, ...: address, index and predicate arithmetic)."""
    for g, fams in GROUPS.items():
        if family in fams:
            return g
    return "integer"


@dataclass(frozen=True)
class Instr:
    """One SASS instruction: its byte address in the function, guard predicate ("" or e.g. "@!P0"), opcode with
    modifiers ("IMAD.MOV.U32") and the whole text."""

    addr: int
    pred: str
    op: str
    text: str

    @property
    def family(self) -> str:
        return self.op.split(".")[0]

    def branch_target(self) -> int | None:
        """The target address of a direct branch (BRA), else None."""
        if self.family != "BRA":
            return None
        m = re.search(r"(?:`\()?0x([0-9a-f]+)\)?\s*$", self.text)
        return int(m.group(1), 16) if m else None


_FUNC = re.compile(r"^\s*Function\s*:\s*(\S+)")
_INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")


def parse(text: str) -> dict[str, list[Instr]]:
    """cuobjdump -sass output -> {mangled function name: its instructions in address order}."""
    funcs: dict[str, list[Instr]] = {}
    cur: list[Instr] | None = None
    for line in text.splitlines():
        m = _FUNC.match(line)
        if m:
            cur = funcs.setdefault(m.group(1), [])
            continue
        m = _INSTR.match(line)
        if m and cur is not None:
            body = m.group(2)
            pred = ""
            if body.startswith("@"):
                pred, _, body = body.partition(" ")
                body = body.lstrip()
            op = body.split(None, 1)[0] if body else ""
            cur.append(Instr(int(m.group(1), 16), pred, op, body))
    return funcs


def find_cuobjdump() -> str | None:
    """cuobjdump: $HOTPATHS_CUOBJDUMP, then PATH, then the nvidia-cuda-cuobjdump wheel, then /usr/local/cuda."""
    env = os.environ.get("HOTPATHS_CUOBJDUMP")
    if env:
        return env if Path(env).is_file() else None
    hit = shutil.which("cuobjdump")
    if hit:
        return hit
    try:
        import nvidia  # the namespace package the NVIDIA CUDA wheels install into

        for root in getattr(nvidia, "__path__", []):
            for cand in sorted(Path(root).glob("*/bin/cuobjdump"), reverse=True):
                if cand.is_file():
                    return str(cand)
    except ImportError:
        pass
    toolkit = Path("/usr/local/cuda/bin/cuobjdump")
    return str(toolkit) if toolkit.is_file() else None


def disassemble(lib: str | Path, *, tool: str | None = None, timeout: float = 120.0) -> str:
    """``cuobjdump -sass lib``'s text. Raises FileNotFoundError (no such library, or no cuobjdump: says where it
    looked) or RuntimeError (cuobjdump failed, with its message)."""
    lib = Path(lib)
    if not lib.is_file():
        raise FileNotFoundError(f"lib: no such file {lib}")
    tool = tool or find_cuobjdump()
    if tool is None:
        raise FileNotFoundError("cuobjdump not found ($HOTPATHS_CUOBJDUMP, PATH, the nvidia-cuda-cuobjdump wheel, "
                                "/usr/local/cuda/bin): `make setup` installs the wheel")
    # cuobjdump runs nvdisasm for the disassembly: the one beside it first (the wheels share nvidia/cu*/bin)
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(tool).resolve().parent), env.get("PATH", "")])
    proc = subprocess.run([tool, "-sass", str(lib)], capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"cuobjdump -sass {lib} failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return proc.stdout


def find_function(funcs: dict[str, list[Instr]], pattern: str) -> tuple[str, list[Instr]]:
    """The one function whose mangled name matches the regex ``pattern``. Raises ValueError naming the candidates
    when none or several match (an exact name always wins over partial matches)."""
    if pattern in funcs:
        return pattern, funcs[pattern]
    rx = re.compile(pattern)
    hits = [n for n in funcs if rx.search(n)]
    if len(hits) != 1:
        what = "no function" if not hits else f"{len(hits)} functions"
        names = "\n  ".join(hits or sorted(funcs))
        raise ValueError(f"kernel: {what} match {pattern!r}; the candidates:\n  {names}")
    return hits[0], funcs[hits[0]]


@dataclass(frozen=True)
class Loop:
    """A loop as the address range [start, end] of a backward branch at ``end`` to ``start``."""

    start: int
    end: int

    def body(self, instrs: list[Instr]) -> list[Instr]:
        return [i for i in instrs if self.start <= i.addr <= self.end]


def loops(instrs: list[Instr]) -> list[Loop]:
    """Every backward branch's range, largest first (nested loops appear inside the ranges of their parents)."""
    out = {Loop(t, i.addr) for i in instrs if (t := i.branch_target()) is not None and t <= i.addr}
    return sorted(out, key=lambda lp: (lp.start - lp.end, lp.start))


def main_loop(instrs: list[Instr]) -> Loop:
    """The loop holding the most tensor-core instructions; among equals the tightest range (a per-tile loop whose
    rarer path, e.g. an epilogue, ends in a second backward branch to the same head yields two ranges: the shorter
    is the iteration without it). The largest loop when none holds any. Raises ValueError for a function without a
    loop."""
    lps = loops(instrs)
    if not lps:
        raise ValueError("the function has no backward branch (no loop)")

    def score(lp: Loop):
        body = lp.body(instrs)
        tensor = sum(group_of(i.family) == "tensor" for i in body)
        return (tensor, -len(body) if tensor else len(body))

    return max(lps, key=score)


def mix(instrs: list[Instr]) -> dict:
    """Instruction mix: total, the count per group (GROUPS plus "integer") and per opcode family."""
    fam = Counter(i.family for i in instrs)
    grp = Counter()
    for f, n in fam.items():
        grp[group_of(f)] += n
    return {"instructions": len(instrs), "groups": dict(grp.most_common()), "families": dict(fam.most_common())}


def kernel_mix(op: str, kernel: str, *, loop: bool = False) -> dict:
    """Build op's library if needed and return the mix of the function matching ``kernel`` (or of its main loop):
    {"function", "range" (None for the whole function), "instructions", "groups", "families"}."""
    from hotpaths.kernels import _build

    funcs = parse(disassemble(_build.compile_op(op)))
    name, instrs = find_function(funcs, kernel)
    rng = None
    if loop:
        lp = main_loop(instrs)
        instrs, rng = lp.body(instrs), (hex(lp.start), hex(lp.end))
    return {"function": name, "range": rng, **mix(instrs)}
