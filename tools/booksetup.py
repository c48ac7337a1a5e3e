"""Run by the first (hidden) cell of every chapter: work from the repository root, and let listing cells be
listings.

A cell that starts with `#| file: minisgl/...` or `#| file: tests/...` is a part of a package file (it may use
relative imports), so running it in the kernel would fail or shadow the real package. Here such cells are
compiled (a syntax check) and not executed; `python tools/steps.py tangle` writes them to disk, and the
demo cells import the tangled package. `examples/...` cells are whole scripts and run as they are.
"""
from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _listing_guard(lines: list[str]) -> list[str]:
    if lines and lines[0].startswith("#| file:") and not lines[0].split(":", 1)[1].strip().startswith("examples/"):
        src = "".join(lines)
        compile(src, "<listing>", "exec")  # 语法错误照样报出来
        return ["pass  # 源码单元格：python tools/steps.py tangle 写入文件，这里不执行\n"]
    return lines


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
