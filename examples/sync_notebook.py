#!/usr/bin/env python3
"""Writes the notebook beside a percent-format script (jupytext's "percent"
format: cells start at ``# %%`` lines, ``# %% [markdown]`` cells are
comment lines), so the ``.py`` stays the one source of an example:

    .venv/bin/python examples/sync_notebook.py examples/pbt_from_python.py
    .venv/bin/python examples/sync_notebook.py --check examples/pbt_from_python.py

``--check`` exits 1 when the ``.ipynb`` differs from what the script gives
(tests/python/notebook_test.py runs it). Needs nbformat only; ``jupytext
--to ipynb`` reads the same script too, with metadata of its own.
"""
import argparse
import os
import sys

import nbformat

CELL = "# %%"


def _markdown(lines):
    out = []
    for line in lines:
        if line.startswith("# "):
            out.append(line[2:])
        elif line.rstrip() == "#":
            out.append("")
        else:
            raise ValueError(f"a markdown cell's line is not a comment: {line!r}")
    return out


def _trim(lines):
    while lines and not lines[0].strip():
        lines = lines[1:]
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    return lines


def notebook_of(script_text):
    """The notebook (nbformat v4, no outputs) of a percent-format script."""
    cells, kind, lines = [], None, []

    def close():
        body = _trim(lines)
        if kind is None:
            if body:
                raise ValueError("text before the first '# %%' cell marker")
            return
        if kind == "markdown":
            cells.append(nbformat.v4.new_markdown_cell("\n".join(_markdown(body))))
        else:
            cells.append(nbformat.v4.new_code_cell("\n".join(body)))

    for line in script_text.splitlines():
        if line.startswith(CELL):
            close()
            kind = "markdown" if "[markdown]" in line[len(CELL):] else "code"
            lines = []
        else:
            lines.append(line)
    close()
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    # Stable ids: the notebook is rewritten only when a cell changes.
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i:02d}"
    return nb


def notebook_text(script_path):
    with open(script_path, encoding="utf-8") as f:
        nb = notebook_of(f.read())
    nbformat.validate(nb)
    return nbformat.writes(nb) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("script", help="the percent-format .py; the notebook is the same name .ipynb")
    p.add_argument("--check", action="store_true", help="exit 1 when the .ipynb is out of date")
    args = p.parse_args()
    target = os.path.splitext(args.script)[0] + ".ipynb"
    text = notebook_text(args.script)
    if args.check:
        try:
            with open(target, encoding="utf-8") as f:
                current = f.read()
        except FileNotFoundError:
            current = None
        if current != text:
            print(f"{target} is out of date: run {sys.argv[0]} {args.script}", file=sys.stderr)
            sys.exit(1)
        return
    with open(target, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {target} ({text.count('cell_type')} cells)")


if __name__ == "__main__":
    main()
