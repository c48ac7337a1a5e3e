"""Run by the first (hidden) cell of every chapter, `%run tools/booksetup.py 3`: work inside chapter 3's tree,
and let listing cells be listings.

Chapter N's tree is `.build/trees/chNN/` (tools/steps.py `materialise`): minisgl/, examples/ and tests/ exactly
as of chapter N, written from the saved notebooks (only the files that changed; fast when nothing did), plus
links to tools/, models/ and practice/. The kernel works there: the tree is first on sys.path, the current
directory (so `!python examples/…`, `python -c`, `python -m` see the same files) and first on PYTHONPATH
(so every subprocess and the processes it spawns import it too). A reader of chapter 3 runs chapter 3's code,
even when later chapters changed the same files.

A cell that starts with `#| file: minisgl/...` or `#| file: tests/...` is a part of a package file (it may use
relative imports), so running it in the kernel would fail or shadow the real package. Here such cells are
compiled (a syntax check) and not executed; the tree already holds them, and the demo cells import it.
A listing that differs from the saved notebooks (the reader edited it), or that the tree does not hold yet,
prints how to get the change in. `examples/...` cells are whole scripts and run as they are.

A cell tagged `gpu` in this chapter's saved notebook (the kernel sees a cell's code, not its tags: the guard
compares the code with the saved gpu cells) prints one line and is not run when torch sees no CUDA GPU, so that
"Run All" on a laptop goes on to the cells after it instead of stopping at its error.
"""
from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_EDITED = ("print('这个源码单元格和 book/chapters/ 里保存的版本不同：保存笔记本，再重启内核、从头运行'\n"
           "      '（第一个单元格按保存的笔记本重建本章的树 {tree}），后面的单元格才会用到你的修改。')\n")
_STALE = ("print('本章的树里 {tree}/{file} 还不是这段代码：重启内核、从头运行'\n"
          "      '（第一个单元格按保存的笔记本重建这棵树）。')\n")
_QUIET = "pass  # 源码单元格：它已经在本章的树 {tree} 里（由保存的笔记本生成），这里不执行\n"
_NO_GPU = "print('跳过：这一格要 CUDA GPU，这台机器上没有；它在 GPU 上跑出的输出印在书里。后面的单元格照常运行。')\n"

_STATE: dict = {}  # chapter: 本章编号；tree: 本章的树


def _tree_label() -> str:
    tree = _STATE.get("tree")
    return tree.relative_to(ROOT).as_posix() if tree else ".build/trees"


def _listing_guard(lines: list[str]) -> list[str]:
    if "".join(lines).strip() in _STATE.get("gpu_cells", ()) and not _has_cuda():
        return [_NO_GPU]
    if lines and lines[0].startswith("#| file:") and not lines[0].split(":", 1)[1].strip().startswith("examples/"):
        src = "".join(lines)
        compile(src, "<listing>", "exec")  # 语法错误照样报出来
        return [(_hint(src) or _QUIET).format(tree=_tree_label(), file="{file}")]
    return lines


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _gpu_cells(chapter: int) -> set:
    """第 chapter 章保存的笔记本里带 gpu 标签的代码单元格的源码（去掉首尾空白）。"""
    import json

    cells = json.loads(_steps().chapter_path(chapter).read_text(encoding="utf-8"))["cells"]
    return {"".join(c["source"]).strip() for c in cells
            if c["cell_type"] == "code" and "gpu" in c.get("metadata", {}).get("tags", [])}


def _steps():
    """tools/steps.py（同一套解析规则），按文件路径加载：%run 结束后 tools/ 不在 sys.path 上。"""
    import importlib.util

    name = "_minisgl_book_steps"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / "steps.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclass 需要在 sys.modules 里找到自己的模块
        spec.loader.exec_module(module)
    return sys.modules[name]


def _hint(src: str) -> str | None:
    """读者改过这段（和保存的笔记本不同），或者本章的树里还不是这段：返回一句提示；否则 None。"""
    steps = _steps()
    cell = steps.parse_cell(src.rstrip("\n"), "this cell")
    if cell is None or cell.excerpt or "chapter" not in _STATE:
        return None
    key = tuple((p.name, p.stat().st_mtime) for p in steps.chapter_paths())
    if _STATE.get("key") != key:  # 笔记本一改就重新读
        saved = {}
        chapters = steps.load_chapters()
        for ch in chapters:
            for c in ch.cells:
                saved.setdefault((c.file, c.part, c.body), ch.num)
        _STATE.update(key=key, saved=saved,
                      parts={(c.file, c.part): ch.num for ch in chapters if ch.num <= _STATE["chapter"]
                             for c in ch.cells if not c.excerpt})
    num = _STATE["saved"].get((cell.file, cell.part, cell.body))
    if num is None:
        return _EDITED
    if num > _STATE["chapter"] or _STATE["parts"].get((cell.file, cell.part), num) > num:
        return None  # 后面章节的代码，或者本章之前已被替换：不是这棵树该有的
    path = _STATE["tree"] / cell.file
    if path.exists() and steps._contains(path.read_text(encoding="utf-8"), cell.body):
        return None
    return _STALE.replace("{file}", cell.file)


def setup(chapter: int) -> None:
    # tqdm.auto 在没有 ipywidgets 的内核里会抱怨一句，与本书无关
    warnings.filterwarnings("ignore", message="IProgress not found")
    steps = _steps()
    tree, _, _ = steps.materialise(chapter)
    _STATE.update(chapter=chapter, tree=tree, gpu_cells=_gpu_cells(chapter))
    _STATE.pop("key", None)
    loaded = sys.modules.get("minisgl")
    if loaded is not None and not Path(loaded.__file__ or "").resolve().is_relative_to(tree.resolve()):
        print(f"这个内核已经从 {Path(loaded.__file__).parent} 导入过 minisgl：重启内核再从头运行，"
              f"才会用第 {chapter} 章的代码（{_tree_label()}）。")
    os.chdir(tree)
    drop = {str(tree), str(ROOT), "", "."} | {str(p) for p in steps.TREES.glob("ch*")}
    sys.path[:] = [str(tree)] + [p for p in sys.path if p not in drop]
    os.environ["PYTHONPATH"] = steps.tree_pythonpath(tree)  # 子进程（和它们 spawn 的进程）也用这棵树
    try:
        ip = get_ipython()  # type: ignore[name-defined]  # noqa: F821 (only inside IPython)
    except NameError:
        return
    transforms = ip.input_transformers_cleanup  # 再运行一次（也许换了一章）：换成这次的 guard
    transforms[:] = [t for t in transforms if getattr(t, "__name__", "") != "_listing_guard"]
    transforms.insert(0, _listing_guard)


def _chapter_from_argv() -> int:
    if len(sys.argv) != 2:
        raise SystemExit("usage: %run tools/booksetup.py N   (N: this notebook's chapter number)")
    try:
        return _steps().chapter_arg(sys.argv[1])
    except Exception as e:  # argparse.ArgumentTypeError 带着可读的说明
        raise SystemExit(f"booksetup: {e}") from None


setup(_chapter_from_argv())
