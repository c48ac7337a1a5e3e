#!/usr/bin/env python3
"""Edit chapter notebooks as text, safely (a jupytext round trip that keeps stored outputs).

    python tools/nb.py export ch03          book/chapters/ch03_*.ipynb -> .edit/ch03_*.md (MyST markdown)
    python tools/nb.py export performance   a page outside the chapters: book/performance.ipynb -> .edit/performance.md
    python tools/nb.py import .edit/ch03_models.md
                                            .edit/….md -> book/chapters/….ipynb; cells whose source did not
                                            change keep their outputs, changed cells lose theirs (re-execute)
    python tools/nb.py new .edit/ch03_models.md   same as import, for a notebook that does not exist yet
    python tools/nb.py upgrade-cells [--no-execute]
                                            every chapter's setup cell -> `%run tools/booksetup.py N`, its test
                                            cell -> `!{sys.executable} tools/steps.py test N` (ids, tags kept);
                                            the changed test cells are then run for real (steps.py execute
                                            --cells) so their stored outputs are new. Idempotent.

The .md twin is a working copy (ignored by git): the notebook is the source.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import jupytext
import nbformat

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = ROOT / "book" / "chapters"
EDIT = ROOT / ".edit"
KERNEL = {"display_name": "Python 3", "language": "python", "name": "python3"}


def export(chapter: str) -> Path:
    sys.path.insert(0, str(ROOT / "tools"))
    from steps import chapter_arg, chapter_path

    page = ROOT / "book" / f"{Path(chapter).stem}.ipynb"  # a page outside the chapters (the 性能 page): by name
    try:
        path = page if page.exists() else chapter_path(chapter_arg(chapter))
    except Exception as e:  # argparse.ArgumentTypeError 带着可读的说明
        raise SystemExit(f"nb.py export: {e}") from None
    nb = nbformat.read(path, as_version=4)
    EDIT.mkdir(exist_ok=True)
    out = EDIT / (path.stem + ".md")
    jupytext.write(nb, out, fmt="md:myst")
    print(f"wrote {out.relative_to(ROOT)}")
    return out


def to_notebook(md: Path) -> Path:
    md = Path(md)
    new = jupytext.read(md, fmt="md:myst")
    target = CHAPTERS / (md.stem + ".ipynb")
    if not target.exists() and (ROOT / "book" / (md.stem + ".ipynb")).exists():
        target = ROOT / "book" / (md.stem + ".ipynb")
    old = nbformat.read(target, as_version=4) if target.exists() else None
    old_outputs = {}
    old_ids = {}  # 没改的 markdown 单元格也保留 id
    if old is not None:
        for c in old.cells:
            old_ids.setdefault((c.cell_type, c.source), c.get("id"))
            if c.cell_type == "code":
                old_outputs.setdefault(c.source, (c.get("outputs", []), c.get("execution_count"), c.get("id")))
    cells = []
    for c in new.cells:
        if c.cell_type == "code":
            outputs, count, cid = old_outputs.get(c.source, ([], None, None))
            cell = nbformat.v4.new_code_cell(c.source, outputs=outputs, execution_count=count)
            if cid:  # 没改的单元格保留原来的 id，diff 才干净
                cell.id = cid
            tags = c.metadata.get("tags")
            if tags:
                cell.metadata["tags"] = list(tags)
            if c.metadata.get("mystnb"):  # 图的标题、替代文字（myst-nb 的单元格选项）
                cell.metadata["mystnb"] = dict(c.metadata["mystnb"])
        elif c.cell_type == "markdown":
            cell = nbformat.v4.new_markdown_cell(c.source)
            if old_ids.get(("markdown", c.source)):
                cell.id = old_ids[("markdown", c.source)]
        else:
            cell = nbformat.v4.new_raw_cell(c.source)
        cells.append(cell)
    nb = nbformat.v4.new_notebook(cells=cells)
    if old is not None:  # 执行时记下的 language_info 等元数据照旧保留，diff 才干净
        nb.metadata = old.metadata
    nb.metadata.setdefault("kernelspec", KERNEL)
    nb.metadata.setdefault("language_info", {"name": "python"})
    nbformat.validate(nb)
    CHAPTERS.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, target)
    kept = sum(1 for c in cells if c.cell_type == "code" and c.outputs)
    print(f"wrote {target.relative_to(ROOT)} ({len(cells)} cells, {kept} with stored outputs)")
    return target


def setup_source(num: int) -> str:
    """The first (hidden) cell of chapter `num` (CONTRIBUTING.md, standard cells)."""
    return (f"# 在第 {num} 章的树 .build/trees/ch{num:02d}/（到本章为止的 minisgl/、examples/、tests/）里运行；\n"
            "# 源码单元格只做语法检查（见 tools/booksetup.py）\n"
            "import os, sys\n"
            "for _ in range(8):  # 向上找到仓库根目录\n"
            "    if os.path.exists(\"tools/booksetup.py\"):\n"
            "        break\n"
            "    os.chdir(\"..\")\n"
            "else:\n"
            "    raise RuntimeError(\"请在仓库里打开本笔记本：找不到 tools/booksetup.py\")\n"
            f"%run tools/booksetup.py {num}")


def test_source(num: int) -> str:
    return f"!{{sys.executable}} tools/steps.py test {num}"


_SETUP = re.compile(r"^%run tools/booksetup\.py\b", re.MULTILINE)
_TEST = re.compile(r"^!\{sys\.executable\} (-m pytest\b.*\btests/test_ch\d\d_\w+\.py|tools/steps\.py test\b.*)$")


def upgrade_cells(execute: bool = True) -> int:
    """Rewrite every chapter's setup and test cells to the current standard forms (see the module doc)."""
    sys.path.insert(0, str(ROOT / "tools"))
    from steps import chapter_paths

    failed = 0
    for path in chapter_paths():
        num = int(path.name[2:4])
        nb = nbformat.read(path, as_version=4)
        setups = [c for c in nb.cells if c.cell_type == "code" and _SETUP.search(c.source)]
        tests = [c for c in nb.cells if c.cell_type == "code" and _TEST.match(c.source.strip())]
        if len(setups) != 1 or len(tests) != 1:
            print(f"{path.name}: expected one setup cell and one test cell, found {len(setups)} and {len(tests)}")
            failed += 1
            continue
        changed = []
        for cell, want in ((setups[0], setup_source(num)), (tests[0], test_source(num))):
            if cell.source != want:
                cell.source = want
                if cell.outputs:
                    cell.outputs, cell.execution_count = [], None  # 旧输出不属于新代码
                changed.append(cell)
        if not changed:
            print(f"{path.name}: up to date")
            continue
        nbformat.write(nb, path)
        print(f"{path.name}: rewrote {', '.join('setup' if c is setups[0] else 'test' for c in changed)} cell")
        if execute and tests[0] in changed:  # 测试单元格的输出只来自真实运行
            cmd = [sys.executable, str(ROOT / "tools" / "steps.py"), "execute", f"ch{num:02d}",
                   "--cells", tests[0].id]
            failed += subprocess.run(cmd, cwd=ROOT).returncode != 0
    return 1 if failed else 0


def main() -> int:
    if len(sys.argv) >= 2 and sys.argv[1] == "upgrade-cells" and set(sys.argv[2:]) <= {"--no-execute"}:
        return upgrade_cells(execute="--no-execute" not in sys.argv)
    if len(sys.argv) != 3 or sys.argv[1] not in ("export", "import", "new"):
        print(__doc__)
        return 2
    if sys.argv[1] == "export":
        export(sys.argv[2])
    else:
        to_notebook(Path(sys.argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
