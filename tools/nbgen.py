"""Write a stripped notebook from a list of (kind, source[, tags]) cells. Used by contributors to author notebooks:
`python tools/nbgen.py` is not needed at run time; notebooks are committed as .ipynb."""

from __future__ import annotations

import nbformat


def write(path: str, cells: list[tuple]) -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    for c in cells:
        kind, src = c[0], c[1].strip("\n")
        tags = c[2] if len(c) > 2 else []
        cell = nbformat.v4.new_markdown_cell(src) if kind == "md" else nbformat.v4.new_code_cell(src)
        if tags:
            cell.metadata["tags"] = list(tags)
        cell.pop("id", None)
        nb.cells.append(cell)
    nb.nbformat_minor = 4
    nbformat.write(nb, path)
