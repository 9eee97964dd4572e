"""The output folder and the echo-and-keep log every study writes (imported as a sibling: run the studies as
`python studies/<name>.py`)."""

from __future__ import annotations

from pathlib import Path


class Log:
    """``say(s)`` prints a line at once and keeps it; ``write(name)`` saves the kept lines under the out folder."""

    def __init__(self, out: str) -> None:
        self.out_dir = Path(out)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.lines: list[str] = []

    def say(self, s: str) -> None:
        print(s, flush=True)
        self.lines.append(s)

    def write(self, name: str) -> Path:
        path = self.out_dir / name
        path.write_text("\n".join(self.lines) + "\n")
        return path
