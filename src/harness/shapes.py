"""The case grammar of the articles, parsed in one place.

``AxB`` = A requests of KV length B, joined with ``+``; a ``K`` suffix multiplies by 1024 and may follow a
decimal (``0.125K`` = 128). Examples: ``64x0.5K``, ``1x128K+31x4K``, ``32x0.125K+32x4K``, ``1x16K+15x64``.
"""

from __future__ import annotations

import re

_TERM = re.compile(r"^(?P<count>\d+)x(?P<num>\d+(?:\.\d+)?)(?P<k>[kK]?)$")


class CaseError(ValueError):
    """A malformed case string; the message says which term and what was expected."""


def parse_cases(spec: str) -> list[tuple[int, int]]:
    """Parse ``"1x128K+31x4K"`` into ``[(1, 131072), (31, 4096)]`` (count, KV length in tokens).

    Raises CaseError naming the bad term: not ``<count>x<length>[K]``, a zero count, or a length that is not a
    whole number of tokens. KV length 0 is allowed (``4x0``).
    """
    if not isinstance(spec, str) or not spec.strip():
        raise CaseError(f"case {spec!r}: expected terms like '64x4K' joined with '+', got an empty string")
    out = []
    for term in spec.replace(" ", "").split("+"):
        m = _TERM.match(term)
        if not m:
            raise CaseError(f"case {spec!r}: term {term!r} is not <count>x<length>[K] "
                            "(e.g. '31x4K', '32x0.125K', '15x64')")
        count = int(m.group("count"))
        if count == 0:
            raise CaseError(f"case {spec!r}: term {term!r} has a zero request count")
        length = float(m.group("num")) * (1024 if m.group("k") else 1)
        if length != int(length):
            raise CaseError(f"case {spec!r}: term {term!r} gives {length} tokens, not a whole number")
        out.append((count, int(length)))
    return out


def expand_lengths(cases) -> list[int]:
    """One KV length per request, in order. Accepts a case string or parsed ``[(count, length)]``."""
    if isinstance(cases, str):
        cases = parse_cases(cases)
    return [length for count, length in cases for _ in range(count)]


def format_case(cases) -> str:
    """Inverse of parse_cases, in the articles' style (``4096`` -> ``4K``, ``128`` -> ``0.125K``, ``64`` -> ``64``)."""
    def fmt(n: int) -> str:
        # multiples of 1/8 K from 128 tokens up print as K; shorter lengths print as tokens
        return f"{n / 1024:g}K" if n >= 128 and (n * 8) % 1024 == 0 else str(n)
    return "+".join(f"{c}x{fmt(n)}" for c, n in cases)


def parse_int_list(spec: str, name: str, *, minimum: int = 0) -> list[int]:
    """``"1,2,4"`` -> [1, 2, 4]; raises CaseError naming the option on bad input or a value below ``minimum``."""
    try:
        vals = [int(v) for v in spec.split(",") if v.strip()]
    except ValueError:
        raise CaseError(f"{name} {spec!r}: expected comma-separated integers, e.g. '1,2,4'") from None
    if not vals or any(v < minimum for v in vals):
        raise CaseError(f"{name} {spec!r}: expected integers >= {minimum}")
    return vals


def case_list_arg(spec: str) -> list[str]:
    """argparse type for ``--cases``: ';'- or ','-separated case strings, each validated (exit code 2 on error)."""
    import argparse

    parts = [p.strip() for p in spec.replace(";", ",").split(",") if p.strip()]
    try:
        if not parts:
            raise CaseError(f"--cases {spec!r}: expected at least one case like '64x4K'")
        for p in parts:
            parse_cases(p)
    except CaseError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return parts


def int_list_arg(name: str, *, minimum: int = 0):
    """argparse type factory for comma-separated integers >= minimum (``--m 1,2,4``)."""
    import argparse

    def conv(spec: str) -> list[int]:
        try:
            return parse_int_list(spec, name, minimum=minimum)
        except CaseError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return conv
