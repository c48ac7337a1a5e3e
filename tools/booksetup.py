"""Run by the first (hidden) cell of every chapter: work from the repository root, and let listing cells be
listings.

A cell that starts with `#| file: minisgl/...` or `#| file: tests/...` is a part of a package file (it may use
relative imports), so running it in the kernel would fail or shadow the real package. Here such cells are
compiled (a syntax check) and not executed; `python tools/steps.py tangle` writes them to disk, and the
demo cells import the tangled package. A listing that differs from the saved notebooks (the reader edited it)
prints how to get the change into minisgl/. `examples/...` cells are whole scripts and run as they are.
"""
from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


_EDITED = ("print('这个源码单元格和 book/chapters/ 里保存的版本不同：保存笔记本，运行 python tools/steps.py tangle，'\n"
           "      '再重启内核，后面的单元格才会用到你的修改。')\n")
_UNTANGLED = "print('磁盘上的 {file} 还不是这段代码：运行 python tools/steps.py tangle，再重启内核。')\n"
_QUIET = "pass  # 源码单元格：python tools/steps.py tangle 把它写进文件，这里不执行\n"


def _listing_guard(lines: list[str]) -> list[str]:
    if lines and lines[0].startswith("#| file:") and not lines[0].split(":", 1)[1].strip().startswith("examples/"):
        src = "".join(lines)
        compile(src, "<listing>", "exec")  # 语法错误照样报出来
        return [_hint(src) or _QUIET]
    return lines


_CACHE: dict = {}


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
    """读者改过这段（和保存的笔记本不同），或者保存了但还没 tangle：返回一句提示；否则 None。"""
    steps = _steps()

    cell = steps.parse_cell(src.rstrip("\n"), "this cell")
    if cell is None or cell.excerpt:
        return None
    key = tuple((p.name, p.stat().st_mtime) for p in steps.chapter_paths())
    if _CACHE.get("key") != key:  # 笔记本一改就重新读
        saved, last = {}, {}
        for ch in steps.load_chapters():
            for c in ch.cells:
                saved[(c.file, c.part, c.body)] = ch.num
                last[(c.file, c.part)] = ch.num
        _CACHE.update(key=key, saved=saved, last=last)
    num = _CACHE["saved"].get((cell.file, cell.part, cell.body))
    if num is None:
        return _EDITED
    if _CACHE["last"][(cell.file, cell.part)] > num:  # 后面的章节替换了这一段：磁盘上是新版本，正常
        return None
    path = ROOT / cell.file
    if path.exists() and steps._contains(path.read_text(encoding="utf-8"), cell.body):
        return None
    return _UNTANGLED.format(file=cell.file)


def setup() -> None:
    # tqdm.auto 在没有 ipywidgets 的内核里会抱怨一句，与本书无关
    warnings.filterwarnings("ignore", message="IProgress not found")
    os.chdir(ROOT)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    try:
        ip = get_ipython()  # type: ignore[name-defined]  # noqa: F821 (only inside IPython)
    except NameError:
        return
    transforms = ip.input_transformers_cleanup
    if not any(getattr(t, "__name__", "") == "_listing_guard" for t in transforms):
        transforms.insert(0, _listing_guard)


setup()
