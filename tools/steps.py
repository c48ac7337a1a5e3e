#!/usr/bin/env python3
"""The book's build steps: the notebooks in book/chapters/ are the source of minisgl/, examples/ and tests/.

    python tools/steps.py tangle [--check]   write (or compare) every generated file
    python tools/steps.py tree N             the file tree as of chapter N, with marks and the counts line
    python tools/steps.py check [N ...]      build chapters 1..N alone in a temp dir and run chapter N's example
    python tools/steps.py execute [chNN ...] run notebooks headless (nbclient) and store their outputs
    python tools/steps.py parts [N]          list every (file, part) and the chapter that wrote it last

A code cell is tangled when it starts with directive lines:

    #| file: minisgl/utils/misc.py      the file this cell belongs to
    #| part: div_ceil                   the part's name (default: the whole file)
    #| early                            this chapter creates the file before the chapter about it (提前引入)
    #| excerpt                          show-only: the text must appear verbatim in the file (checked)
    #| remove                           drop this part from the file from this chapter on

A file is its parts joined in first-appearance order; a later chapter that repeats (file, part) replaces
that part in place (修改). Every generated file starts with one line naming its notebooks.
"""
from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Tuple

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = ROOT / "book" / "chapters"
GENERATED = ("minisgl", "examples", "tests")
_NAME = re.compile(r"^ch(\d\d)_[a-z0-9_]+\.ipynb$")


@dataclass
class Cell:
    file: str
    part: str
    body: str
    early: bool = False
    excerpt: bool = False
    remove: bool = False


@dataclass
class Chapter:
    num: int
    path: Path
    cells: List[Cell]

    @property
    def slug(self) -> str:
        return self.path.stem


@dataclass
class State:
    """Files as of some chapter: file -> ordered {part: (body, chapter)}."""

    parts: Dict[str, Dict[str, Tuple[str, int]]] = field(default_factory=dict)

    def content(self, file: str) -> str:
        chapters = sorted({ch for _, ch in self.parts[file].values()})
        names = [chapter_path(c).name for c in chapters]
        src = f"book/chapters/{names[0]}" + "".join(f" and {n}" for n in names[1:])
        noun = "notebook" if len(names) == 1 else "notebooks"
        header = f"# Tangled from {src} — edit the {noun}, not this file.\n"
        bodies = [body for body, _ in self.parts[file].values()]
        return header + "\n\n\n".join(bodies) + "\n"

    def body(self, file: str) -> str:
        return "\n\n\n".join(body for body, _ in self.parts[file].values())

    def files(self, prefix: str = "") -> List[str]:
        return sorted(f for f in self.parts if f.startswith(prefix))


# ----------------------------------------------------------------------------------------------- reading
def chapter_arg(text: str) -> int:
    """argparse type: a chapter given as 5, 05, ch05 or ch05_tensor_parallel; it must exist."""
    m = re.fullmatch(r"(?:ch)?(\d{1,2})(?:_[a-z0-9_]+)?(?:\.ipynb)?", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a chapter (write 5, ch05 or ch05_slug)")
    num = int(m.group(1))
    have = {int(p.name[2:4]): p.name for p in chapter_paths()}
    if num not in have:
        raise argparse.ArgumentTypeError(f"no chapter {text!r}; the notebooks are {sorted(have.values())}")
    return num


def chapter_path(num: int) -> Path:
    for p in CHAPTERS.glob(f"ch{num:02d}_*.ipynb"):
        return p
    raise SystemExit(f"no notebook book/chapters/ch{num:02d}_*.ipynb")


def parse_cell(source: str, where: str) -> Cell | None:
    lines = source.split("\n")
    directives: Dict[str, str] = {}
    i = 0
    while i < len(lines) and lines[i].startswith("#|"):
        key, _, value = lines[i][2:].strip().partition(":")
        directives[key.strip()] = value.strip()
        i += 1
    if "file" not in directives:
        if directives and any(k in directives for k in ("part", "early", "excerpt", "remove")):
            raise SystemExit(f"{where}: directives without '#| file:'")
        return None
    unknown = set(directives) - {"file", "part", "early", "excerpt", "remove"}
    if unknown:
        raise SystemExit(f"{where}: unknown directive(s) {sorted(unknown)}")
    body = "\n".join(lines[i:]).strip("\n")
    file = directives["file"]
    if not file.startswith(tuple(g + "/" for g in GENERATED)):
        raise SystemExit(f"{where}: '#| file: {file}' must be under {', '.join(GENERATED)}/")
    return Cell(file=file, part=directives.get("part") or file, body=body, early="early" in directives,
                excerpt="excerpt" in directives, remove="remove" in directives)


def chapter_paths() -> List[Path]:
    """book/chapters/chNN_slug.ipynb in chapter order; any other notebook there is an error."""
    paths = sorted(CHAPTERS.glob("*.ipynb"))
    for path in paths:
        if not _NAME.match(path.name):
            raise SystemExit(f"{path.relative_to(ROOT)}: chapter notebooks are named chNN_slug.ipynb")
    return paths


def load_chapters() -> List[Chapter]:
    chapters = []
    for path in chapter_paths():
        m = _NAME.match(path.name)
        assert m is not None, path
        nb = json.loads(path.read_text(encoding="utf-8"))
        cells, seen = [], set()
        for i, c in enumerate(nb["cells"]):
            if c["cell_type"] != "code":
                continue
            src = c["source"] if isinstance(c["source"], str) else "".join(c["source"])
            cell = parse_cell(src, f"{path.name} cell {i}")
            if cell is None:
                continue
            key = (cell.file, cell.part, cell.excerpt)
            if key in seen and not cell.excerpt:
                raise SystemExit(f"{path.name} cell {i}: ({cell.file}, {cell.part}) appears twice in one chapter")
            seen.add(key)
            cells.append(cell)
        chapters.append(Chapter(int(m.group(1)), path, cells))
    nums = [c.num for c in chapters]
    if len(set(nums)) != len(nums):
        raise SystemExit(f"two notebooks share a chapter number: {nums}")
    return chapters


def build(chapters: List[Chapter], upto: int | None = None, *, verify: bool = True) -> State:
    state = State()
    for ch in chapters:
        if upto is not None and ch.num > upto:
            break
        excerpts = []
        for cell in ch.cells:
            if cell.excerpt:
                excerpts.append(cell)
            elif cell.remove:
                if cell.part not in state.parts.get(cell.file, {}):
                    raise SystemExit(f"{ch.path.name}: '#| remove' of ({cell.file}, {cell.part}) which does not exist")
                del state.parts[cell.file][cell.part]
                if not state.parts[cell.file]:
                    del state.parts[cell.file]
            else:
                state.parts.setdefault(cell.file, {})[cell.part] = (cell.body, ch.num)
        if verify:
            for cell in excerpts:
                if cell.file not in state.parts or not _contains(state.body(cell.file), cell.body):
                    raise SystemExit(f"{ch.path.name}: excerpt '{cell.file} · {cell.part}' does not appear "
                                     f"verbatim in {cell.file} as of chapter {ch.num}")
    return state


def _contains(text: str, excerpt: str) -> bool:
    excerpt = textwrap.dedent(excerpt)
    if excerpt in text:
        return True
    for indent in {re.match(r"\s*", line).group(0) for line in text.split("\n")}:
        if indent and textwrap.indent(excerpt, indent) in text:
            return True
    return False


# ----------------------------------------------------------------------------------------------- tangle
def cmd_tangle(check: bool) -> int:
    state = build(load_chapters())
    want = {f: state.content(f) for f in state.files()}
    have = {}
    for top in GENERATED:
        for p in (ROOT / top).rglob("*.py"):
            if "__pycache__" not in p.parts:
                have[p.relative_to(ROOT).as_posix()] = p.read_text(encoding="utf-8")
    changed = [f for f in want if have.get(f) != want[f]]
    stale = [f for f in have if f not in want]
    if check:
        for f in changed:
            print(f"differs: {f}" if f in have else f"missing: {f}")
            if f in have:
                diff = difflib.unified_diff(have[f].splitlines(), want[f].splitlines(), "on disk", "tangled",
                                            lineterm="", n=1)
                print("\n".join(list(diff)[:20]))
        for f in stale:
            print(f"not from any notebook: {f}")
        if changed or stale:
            print("tangle --check failed: run `python tools/steps.py tangle` (and never edit generated files)")
            return 1
        print(f"tangle --check: {len(want)} files match the notebooks")
        return 0
    for f in changed:
        path = ROOT / f
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(want[f], encoding="utf-8")
    for f in stale:
        (ROOT / f).unlink()
    print(f"tangle: {len(want)} files ({len(changed)} written, {len(stale)} removed)")
    return 0


# ----------------------------------------------------------------------------------------------- tree
def _order(files: List[str], chapter: Chapter, before: State) -> List[str]:
    """__init__.py first, then the files that existed before (by name), then new ones in chapter order."""
    appear = {c.file: i for i, c in reversed(list(enumerate(chapter.cells)))}
    return sorted(files, key=lambda f: (not f.endswith("/__init__.py"),
                                        -1 if f in before.parts else appear.get(f, 0), f.lower().lstrip("_")))


def tree_lines(num: int) -> List[str]:
    chapters = load_chapters()
    chapter = next((c for c in chapters if c.num == num), None)
    if chapter is None:
        raise SystemExit(f"no chapter {num}")
    before = build(chapters, num - 1, verify=False)
    after = build(chapters, num, verify=False)
    files = after.files("minisgl/")
    early = {c.file for c in chapter.cells if c.early}
    marks: Dict[str, str] = {}
    for f in files:
        if f not in before.parts:
            marks[f] = "提前引入" if f in early else "本章新建"
        elif before.body(f) != after.body(f):
            marks[f] = "修改"
    counts = {m: sum(1 for v in marks.values() if v == m) for m in ("本章新建", "修改", "提前引入")}
    lines = [f"到这一章为止的文件：{len(files)} 个（新建 {counts['本章新建']}，修改 {counts['修改']}，"
             f"提前引入 {counts['提前引入']}）"]
    lines.append("minisgl/")

    def walk(prefix: str, rel: List[str], indent: str) -> None:
        here = [r for r in rel if "/" not in r]
        dirs = sorted({r.split("/", 1)[0] for r in rel if "/" in r})
        ordered_files = _order([prefix + r for r in here], chapter, before)
        entries: List[Tuple[str, str | None]] = [(f, None) for f in ordered_files] + [(d, "dir") for d in dirs]
        for i, (name, kind) in enumerate(entries):
            last = i == len(entries) - 1
            glyph, cont = ("└── ", "    ") if last else ("├── ", "│   ")
            if kind is None:
                mark = f"  ← {marks[name]}" if name in marks else ""
                lines.append(f"{indent}{glyph}{name[len(prefix):]}{mark}")
                continue
            sub = [r.split("/", 1)[1] for r in rel if r.startswith(name + "/")]
            sub_prefix = prefix + name + "/"
            if any((sub_prefix + s) in marks for s in sub):
                lines.append(f"{indent}{glyph}{name}/")
                walk(sub_prefix, sub, indent + cont)
            else:
                lines.append(f"{indent}{glyph}{name}/  （{len(sub)} 个文件，不变）")

    walk("minisgl/", [f[len("minisgl/"):] for f in files], "")
    main = f"examples/{chapter.slug}.py"
    if main in after.parts:
        lines.append(f"这一步的 main：{main}——它只用到上面这些文件；python tools/steps.py check 会逐章搭出这棵树、"
                     f"跑这个 main。")
    return lines


def cmd_tree(num: int) -> int:
    print("\n".join(tree_lines(num)))
    return 0


# ----------------------------------------------------------------------------------------------- check
# 在临时树里运行例子：先确认 import 到的 minisgl 来自这棵树（而不是仓库或已安装的包），再按 __main__ 运行
_BOOT = """
import os, runpy, sys
tmp, script = sys.argv[1], sys.argv[2]
sys.path = [os.path.dirname(script)] + [p for p in sys.path if p not in ("", os.getcwd())]  # 同 python script.py
import minisgl
assert minisgl.__file__.startswith(tmp), f"minisgl was imported from {minisgl.__file__}, not from {tmp}"
sys.argv = [script]
runpy.run_path(script, run_name="__main__")
"""


def cmd_check(nums: List[int], timeout: int) -> int:
    chapters = load_chapters()
    nums = nums or [c.num for c in chapters]
    rows, failed = [], 0
    for num in nums:
        state = build(chapters, num)
        main = f"examples/{chapter_path(num).stem}.py"
        examples = [main] + [f for f in state.files("examples/")
                             if Path(f).name.startswith(f"ch{num:02d}_") and f != main]
        nfiles = len(state.files("minisgl/"))
        if main not in state.parts:
            rows.append((num, nfiles, f"没有 {main}", 0.0))
            failed += 1
            continue
        with tempfile.TemporaryDirectory(prefix=f"minisgl-ch{num:02d}-") as tmp:
            for f in state.files("minisgl/") + examples:
                p = Path(tmp) / f
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_text(state.content(f), encoding="utf-8")
            env = dict(os.environ, PYTHONPATH=tmp, PYTHONUNBUFFERED="1")
            t0 = time.time()
            try:
                proc = subprocess.run([sys.executable, "-c", _BOOT, tmp, str(Path(tmp) / examples[0])], cwd=ROOT,
                                      env=env, capture_output=True, text=True, timeout=timeout)
                ok, out = proc.returncode == 0, proc.stdout + proc.stderr
            except subprocess.TimeoutExpired as e:
                ok, out = False, f"timed out after {timeout}s\n{e.stdout or ''}{e.stderr or ''}"
            dt = time.time() - t0
            result = "ok" if ok else "失败"
            if result != "ok":
                failed += 1
                print(f"--- ch{num:02d} {examples[0]} ---\n" + "\n".join(out.splitlines()[-30:]))
            rows.append((num, nfiles, f"{result} ({examples[0]})", dt))
    print(f"{'chapter':>7}  {'files':>5}  {'seconds':>7}  result")
    for num, nfiles, result, dt in rows:
        print(f"{'ch%02d' % num:>7}  {nfiles:>5}  {dt:7.1f}  {result}")
    print(f"check: {len(rows) - failed} passed, {failed} failed")
    return 1 if failed else 0


# ----------------------------------------------------------------------------------------------- execute
def cmd_execute(names: List[str], timeout: int, gpu_only: bool) -> int:
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if gpu_only and not has_gpu:
        raise SystemExit("execute --gpu-only needs a CUDA GPU")
    paths = [chapter_path(n) for n in names] if names else chapter_paths()
    failed = 0
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        run = nb
        if gpu_only:  # 只跑第一个（设置）单元格和带 gpu 标签的单元格，其余单元格的输出原样保留
            keep = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"
                    and (i == _first_code(nb) or "gpu" in c.metadata.get("tags", []))]
            if len(keep) <= 1:
                continue
            run = nbformat.v4.new_notebook(cells=[nb.cells[i] for i in keep], metadata=nb.metadata)
        t0 = time.time()
        client = NotebookClient(run, timeout=timeout, kernel_name="python3", record_timing=False,
                                resources={"metadata": {"path": str(path.parent)}},
                                skip_cells_with_tag="none" if has_gpu else "gpu")
        try:
            client.execute()
        except CellExecutionError as e:
            failed += 1
            bad = next((i for i, c in enumerate(run.cells) if any(o.get("output_type") == "error"
                                                                   for o in c.get("outputs", []))), None)
            if bad is not None:  # 出错之后的单元格没有运行：清掉它们上一次的输出，免得新旧混在一起
                for c in run.cells[bad + 1:]:
                    if c.cell_type == "code":
                        c.outputs, c.execution_count = [], None
            print(f"FAILED {path.name}: cell {bad} raised\n" + "\n".join(str(e).splitlines()[-15:]))
            continue
        finally:
            nbformat.write(nb, path)  # run 的单元格就是 nb 里的同一批对象
        print(f"executed {path.name} in {time.time() - t0:.0f}s ({'GPU' if has_gpu else 'CPU'}; "
              f"{'only cells tagged gpu' if gpu_only else 'all cells' if has_gpu else 'cells tagged gpu skipped'})")
    return 1 if failed else 0


def _first_code(nb) -> int:
    return next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")


def cmd_parts(upto: int | None) -> int:
    state = build(load_chapters(), upto)
    for f in state.files():
        for part, (body, ch) in state.parts[f].items():
            print(f"ch{ch:02d}  {f} · {part}  ({body.count(chr(10)) + 1} lines)")
    return 0


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="steps.py", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tangle", help="write minisgl/, examples/ and tests/ from the notebooks")
    t.add_argument("--check", action="store_true", help="fail if anything on disk differs")
    tr = sub.add_parser("tree", help="the file tree as of chapter N")
    tr.add_argument("n", type=chapter_arg, help="5, ch05 or ch05_slug")
    c = sub.add_parser("check", help="run each chapter's example against chapters 1..N alone")
    c.add_argument("n", type=chapter_arg, nargs="*", help="chapters (default: all)")
    c.add_argument("--timeout", type=int, default=900)
    e = sub.add_parser("execute", help="run notebooks with nbclient and store the outputs")
    e.add_argument("names", type=chapter_arg, nargs="*", help="chapters (default: all)")
    e.add_argument("--timeout", type=int, default=1200, help="seconds per cell")
    e.add_argument("--gpu-only", action="store_true", help="run only the setup cell and cells tagged gpu")
    p = sub.add_parser("parts", help="list the parts as of chapter N")
    p.add_argument("n", type=chapter_arg, nargs="?")
    args = ap.parse_args(argv)
    if args.cmd == "tangle":
        return cmd_tangle(args.check)
    if args.cmd == "tree":
        return cmd_tree(args.n)
    if args.cmd == "check":
        return cmd_check(args.n, args.timeout)
    if args.cmd == "execute":
        return cmd_execute(args.names, args.timeout, args.gpu_only)
    return cmd_parts(args.n)


if __name__ == "__main__":
    sys.exit(main())
