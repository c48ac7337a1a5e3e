"""Repository-level pytest hooks (hand-written, not tangled): how notebook cells are collected by nbval.

- Cells tagged `gpu` need CUDA: on a machine without it they are skipped, as `tools/steps.py execute` skips them.
- Each chapter's tests run once in CI, through its notebook's test cell `!{sys.executable} tools/steps.py test N`
  under strict nbval (`python tools/book.py nbval`): the cell's output (the summary table, ending in
  `test: X passed, 0 failed, Y skipped`) must equal the stored one. So a chapter notebook must have exactly
  that cell, with its own N, not excused from the comparison (nbval-ignore-output, nbval-skip, …), and its
  stored output must be a passing run. Otherwise the collection stops with the reason.

- At the end of the session it prints how long each notebook took (the sum of its cells' durations) and on which
  pytest-xdist worker it ran, longest first, so a slow notebook is visible.

This file is not seen by `steps.py test`: a chapter's tests run inside .build/trees/chNN/, whose pytest.ini
makes that tree the rootdir.
"""
import re
from pathlib import Path

import pytest

_TEST_CELL = re.compile(r"!\{sys\.executable\} tools/steps\.py test (\d+)")
_PASSED = re.compile(r"^test: ([1-9]\d*) passed, 0 failed, \d+ skipped\s*$", re.MULTILINE)
_EXCUSED = {"nbval-ignore-output", "nbval-skip", "skip-execution", "raises-exception", "gpu"}


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def _source(cell) -> str:
    src = cell.get("source", "")
    return src if isinstance(src, str) else "".join(src)


def _test_cell_problems(path: Path, cells) -> list:
    m = re.match(r"ch(\d\d)_", path.name)
    if not m or path.parent.name != "chapters":
        return []
    num = int(m.group(1))
    found = [c for c in cells if _TEST_CELL.search(_source(c))]
    want = f"!{{sys.executable}} tools/steps.py test {num}"
    if len(found) != 1 or _source(found[0]).strip() != want:
        return [f"{path.name}: needs exactly one test cell `{want}` (found {[_source(c) for c in found]})"]
    cell = found[0]
    problems = []
    excused = _EXCUSED & set(cell.get("metadata", {}).get("tags", []))
    if excused:
        problems.append(f"{path.name}: the test cell is tagged {sorted(excused)}; its output must be compared")
    text = "".join(_source_text(o) for o in cell.get("outputs", []) if o.get("output_type") == "stream")
    if not _PASSED.search(text.replace("\r\n", "\n")) or "失败" in text:
        problems.append(f"{path.name}: the test cell's stored output is not a passing run (`test: N passed, 0 failed"
                        f", M skipped`): run `python tools/steps.py execute {path.stem[:4]}` once the tests pass")
    return problems


def _source_text(o) -> str:
    t = o.get("text", "")
    return t if isinstance(t, str) else "".join(t)


def pytest_collection_modifyitems(config, items):
    notebooks: dict = {}
    for item in items:
        cell = getattr(item, "cell", None)
        if cell is not None:
            notebooks.setdefault(Path(str(item.fspath)), []).append(cell)
    problems = [p for path, cells in notebooks.items() for p in _test_cell_problems(path, cells)]
    if problems:
        raise pytest.UsageError("chapter test cells:\n  " + "\n  ".join(problems))
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="cell tagged gpu: needs CUDA")
    for item in items:
        cell = getattr(item, "cell", None)
        if cell is not None and "gpu" in cell.get("metadata", {}).get("tags", []):
            item.add_marker(skip)


_NOTEBOOK_SECONDS: dict = {}  # notebook -> [seconds, worker]


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::")[0]
    if not path.endswith(".ipynb"):
        return
    row = _NOTEBOOK_SECONDS.setdefault(path, [0.0, ""])
    row[0] += report.duration
    node = getattr(report, "node", None)  # under pytest-xdist: the worker that ran it
    if node is not None:
        row[1] = getattr(getattr(node, "gateway", None), "id", "") or row[1]


def pytest_terminal_summary(terminalreporter):
    if not _NOTEBOOK_SECONDS:
        return
    terminalreporter.write_sep("=", "time per notebook (its cells, summed), longest first")
    per_worker: dict = {}
    for path, (seconds, worker) in sorted(_NOTEBOOK_SECONDS.items(), key=lambda kv: -kv[1][0]):
        terminalreporter.write_line(f"{seconds:7.1f}s  {worker or '-':>4}  {Path(path).name}")
        per_worker[worker] = per_worker.get(worker, 0.0) + seconds
    if len(per_worker) > 1:
        terminalreporter.write_line("  per worker: " + ", ".join(f"{w} {s:.0f}s" for w, s in sorted(per_worker.items())))
