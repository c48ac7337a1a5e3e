#!/usr/bin/env python3
"""Take the stored outputs of chosen cells from a notebook that ran elsewhere (the GPU machine's copy).

    python tools/nb_take_outputs.py FROM.ipynb [--cells ID,...]   (default: the cells tagged gpu)

The notebook of the same name under book/chapters/ receives, for each chosen cell, the outputs and execution count
of the cell with the same id in FROM — only if that cell's source is identical in both (otherwise it says so and
changes nothing). A cell whose id is not in FROM (tools/nb.py import gives new ids to cells it re-creates) takes
the outputs of the one code cell in FROM with the identical source, if there is exactly one.
tools/gpu_check.sh brings the executed notebooks back under $OUT/notebooks/.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("source", type=Path)
    ap.add_argument("--cells", default="", help="cell ids, comma-separated (default: every cell tagged gpu)")
    args = ap.parse_args()
    dest = ROOT / "book" / "chapters" / args.source.name
    src_nb, dst_nb = nbformat.read(args.source, as_version=4), nbformat.read(dest, as_version=4)
    want = [c for c in args.cells.split(",") if c]
    src = {c.id: c for c in src_nb.cells}
    by_source: dict = {}
    for c in src_nb.cells:
        if c.cell_type == "code":
            by_source.setdefault(c.source, []).append(c)
    taken = 0
    for cell in dst_nb.cells:
        chosen = cell.id in want if want else "gpu" in cell.metadata.get("tags", [])
        if not chosen or cell.cell_type != "code":
            continue
        other = src.get(cell.id)
        if other is None and len(by_source.get(cell.source, [])) == 1:
            other = by_source[cell.source][0]
        if other is None or other.source != cell.source:
            print(f"{dest.name}: cell {cell.id}: {'missing' if other is None else 'source differs'} in {args.source}; "
                  f"left as it is", file=sys.stderr)
            continue
        cell.outputs, cell.execution_count = other.outputs, other.execution_count
        taken += 1
    nbformat.write(dst_nb, dest)
    print(f"{dest.name}: outputs of {taken} cell(s) taken from {args.source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
