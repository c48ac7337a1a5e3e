#!/usr/bin/env python3
"""The book's build steps: the notebooks in book/chapters/ are the source of minisgl/, examples/ and tests/.

    python tools/steps.py tangle [--check]   write (or compare) every generated file
    python tools/steps.py tree N             the file tree as of chapter N, with marks and the counts line
    python tools/steps.py tree-dir N         write chapter N's tree to .build/trees/chNN/ and print its path
    python tools/steps.py test [N ...] [--gpu] [--show-output] [-- pytest args]
                                             each chapter's tests (tests/test_chNN_*.py) inside its own tree
    python tools/steps.py check [N ...] [--static]
                                             run chapter N's example inside chapter N's tree (--static: only
                                             compile it, resolve its minisgl imports against chapters 1..N, and
                                             run pyflakes on the tree: no undefined names)
    python tools/steps.py execute [chNN ...] [--gpu-only | --cells ID,...]
                                             run notebooks headless (nbclient) and store their outputs
                                             (--gpu-only / --cells: only the setup cell and those cells)
    python tools/steps.py parts [N]          list every (file, part) and the chapter that wrote it last

A code cell is tangled when it starts with directive lines:

    #| file: minisgl/utils/misc.py      the file this cell belongs to
    #| part: div_ceil                   the part's name (default: the whole file)
    #| early                            this chapter creates the file before the chapter about it (提前引入)
    #| excerpt                          show-only: the text must appear verbatim in the file (checked)
    #| remove                           drop this part from the file from this chapter on

A file is its parts joined in first-appearance order; a later chapter that repeats (file, part) replaces
that part in place (修改). Every generated file starts with one line naming its notebooks. A tangled .py file
may not define the same top-level name twice (def, class or plain assignment): tangle names the parts.

Chapter trees: `.build/trees/chNN/` (ignored by git) holds minisgl/, examples/ and tests/ exactly as of
chapter N (the same text `tangle` would write after chapter N), a pytest.ini with the project's markers, and
links to tools/, benchmarks/, models/ and practice/. The notebook of chapter N works inside it (tools/booksetup.py), and
`test` and `check` run there: a reader of chapter 3 runs chapter 3's code, not the final minisgl/.

Notebooks after 15 are appendices (16 ch16_scale, 17 ch17_structured): numbered after chapter 15 so that their
parts are tangled on top of the tree before them (`tree 15` is unchanged); each gets a tree, tests and an
example like a chapter.
"""
from __future__ import annotations

import argparse
import ast
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
TREES = ROOT / ".build" / "trees"
TREE_LINKS = ("tools", "benchmarks", "models", "practice")  # 树里的相对路径（tools/steps.py、benchmarks/…、models/Qwen3-0.6B）照样能用
_NAME = re.compile(r"^ch(\d\d)_[a-z0-9_]+\.ipynb$")
LAST_CHAPTER = 15  # 之后的笔记本（ch16_scale、ch17_structured）是附录：代码叠在前一篇的树上，tree 15 不受影响


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


# ----------------------------------------------------------------------------------------------- duplicates
def _top_level_names(tree: ast.Module, assignments: bool = True) -> List[Tuple[str, int]]:
    """(name, line) for every module-level def, class and (if `assignments`) plain name assignment."""
    found = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.append((node.name, node.lineno))
        elif not assignments:
            continue
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                for t in ([target] if isinstance(target, ast.Name) else
                          target.elts if isinstance(target, (ast.Tuple, ast.List)) else []):
                    if isinstance(t, ast.Name):
                        found.append((t.id, node.lineno))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            found.append((node.target.id, node.lineno))
    return found


def duplicate_names(state: State) -> List[Tuple[str, str, str]]:
    """A tangled .py file that defines one top-level name twice (the later silently wins):
    (file, name, what) naming the parts and the chapters that wrote them."""
    problems = []
    for file in state.files():
        if not file.endswith(".py"):
            continue
        try:
            tree = ast.parse(state.content(file), filename=file)
        except SyntaxError as e:
            problems.append((file, "", f"does not parse (line {e.lineno}: {e.msg})"))
            continue
        spans, line = [], 2  # 第 1 行是 "# Tangled from …"；各部分之间隔两个空行
        for part, (body, ch) in state.parts[file].items():
            n = body.count("\n") + 1
            spans.append((line, line + n - 1, part, ch))
            line += n + 2
        where: Dict[str, List[int]] = {}
        # 例子和测试是脚本：变量重新赋值（t0 = …）是正常的，只查 def 和 class；minisgl/ 里连赋值也查
        for name, lineno in _top_level_names(tree, assignments=file.startswith("minisgl/")):
            where.setdefault(name, []).append(lineno)
        for name, lines in where.items():
            if len(lines) < 2:
                continue
            owners = [next((s for s in spans if s[0] <= n <= s[1]), (n, n, "?", 0)) for n in lines]
            chapters = sorted({o[3] for o in owners if o[3]})
            problems.append((file, name, f"top-level name '{name}' is defined {len(lines)} times: " + ", ".join(
                f"line {n} (part '{o[2]}', ch{o[3]:02d})" for n, o in zip(lines, owners)) + " — fix it in "
                + ", ".join(chapter_path(c).name for c in chapters)))
    return problems


def check_duplicates(chapters: List[Chapter]) -> List[str]:
    """duplicate_names in every chapter's tree (a reader of chapter 3 runs chapter 3's files), each problem
    reported once, at the first chapter where it appears."""
    problems, seen = [], set()
    for ch in chapters:
        for file, name, what in duplicate_names(build(chapters, ch.num, verify=False)):
            if (file, name) not in seen:
                seen.add((file, name))
                problems.append(f"{file} (as of chapter {ch.num}): {what}")
    return problems


# ----------------------------------------------------------------------------------------------- tangle
def cmd_tangle(check: bool) -> int:
    chapters = load_chapters()
    state = build(chapters)
    duplicates = check_duplicates(chapters)
    for p in duplicates:
        print(p)
    if duplicates:
        print(f"tangle{' --check' if check else ''} failed: a name defined twice in one file (the later "
              f"definition silently replaces the earlier one)")
        return 1
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
    where = "附录" if num > LAST_CHAPTER else "这一章"
    lines = [f"到{where}为止的文件：{len(files)} 个（新建 {counts['本章新建']}，修改 {counts['修改']}，"
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


# ----------------------------------------------------------------------------------------------- chapter trees
def tree_dir(num: int) -> Path:
    return TREES / f"ch{num:02d}"


def _pytest_ini(num: int) -> str:
    """The markers and filters of pyproject.toml's [tool.pytest.ini_options], for a tree (its own rootdir)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    opts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["pytest"]["ini_options"]
    lines = [f"# Written by tools/steps.py: chapter {num}'s tree, from pyproject.toml. Do not edit.", "[pytest]",
             "testpaths = tests", "markers ="]
    lines += [f"    {m}" for m in opts.get("markers", [])]
    if opts.get("filterwarnings"):
        lines += ["filterwarnings ="] + [f"    {w}" for w in opts["filterwarnings"]]
    return "\n".join(lines) + "\n"


def materialise(num: int, chapters: List[Chapter] | None = None) -> Tuple[Path, int, int]:
    """Write chapter `num`'s tree to .build/trees/chNN/: minisgl/, examples/, tests/ as of chapter `num` (the
    text `tangle` writes), pytest.ini, and links to tools/, benchmarks/, models/, practice/. Only files whose content
    changed are written; files no chapter up to `num` makes are deleted. Returns (dir, written, removed)."""
    chapters = chapters if chapters is not None else load_chapters()
    state = build(chapters, num)
    root = tree_dir(num)
    want = {f: state.content(f) for f in state.files()}
    want["pytest.ini"] = _pytest_ini(num)
    written = removed = 0
    for f, text in want.items():
        path = root / f
        try:
            if path.read_text(encoding="utf-8") == text:
                continue
        except (FileNotFoundError, UnicodeDecodeError, IsADirectoryError):
            pass
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)  # 同时读这棵树的进程要么看到旧文件，要么看到新文件
        written += 1
    for top in GENERATED:
        base = root / top
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*"), reverse=True):  # 先文件后目录，深的在前
            if "__pycache__" in path.parts:
                continue
            rel = path.relative_to(root).as_posix()
            if path.is_file() and rel not in want:
                path.unlink()
                removed += 1
            elif path.is_dir() and not any(p.name != "__pycache__" for p in path.iterdir()):
                shutil.rmtree(path)
    for name in TREE_LINKS:
        link = root / name
        if not link.is_symlink():
            try:
                link.symlink_to(Path("..") / ".." / ".." / name, target_is_directory=True)
            except OSError:  # 不能建符号链接的文件系统：树里就没有这个目录
                pass
    return root, written, removed


def cmd_tree_dir(num: int) -> int:
    root, written, removed = materialise(num)
    print(root)
    print(f"ch{num:02d}: {written} files written, {removed} removed", file=sys.stderr)
    return 0


# 在章节树里跑 pytest：会话结束时记下结果计数和 minisgl 是从哪里导入的（必须是这棵树）
_PYTEST_BOOT = """
import json, sys
import pytest
report, args = sys.argv[1], sys.argv[2:]


class _Report:
    def pytest_terminal_summary(self, terminalreporter):
        stats = {k: len(v) for k, v in terminalreporter.stats.items() if k}
        mods = {n: getattr(m, "__file__", None) or "" for n, m in list(sys.modules.items())
                if n == "minisgl" or n.startswith("minisgl.")}
        with open(report, "w") as f:
            json.dump({"stats": stats, "modules": mods}, f)


sys.exit(pytest.main(args, plugins=[_Report()]))
"""


def tree_pythonpath(root: Path) -> str:
    """PYTHONPATH for a process working in a tree: the tree first (spawned children import it too); other
    entries kept (a wheel folder on the GPU machine) except the repository root and other chapter trees."""
    def shadows(p: str) -> bool:
        path = Path(p).resolve()
        return path == ROOT or path.is_relative_to(TREES.resolve())

    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and not shadows(p)]
    return os.pathsep.join([str(root)] + rest)


def _tree_env(root: Path) -> Dict[str, str]:
    return dict(os.environ, PYTHONPATH=tree_pythonpath(root), PYTHONUNBUFFERED="1")


def cmd_test(nums: List[int], gpu: bool, extra: List[str], timeout: int, show: bool = False) -> int:
    if os.environ.get("BOOK_TEST_SHARE"):
        return _cmd_test(nums, gpu, extra, timeout, show)
    # 这一次运行的各章共用的参照答案（tests/conftest.py 的 reference）：一个新目录，运行完就删；
    # tools/book.py nbval 给整轮笔记本设一个，每个笔记本的测试单元格都用它
    with tempfile.TemporaryDirectory(prefix="minisgl-test-share-") as share:
        os.environ["BOOK_TEST_SHARE"] = share
        try:
            return _cmd_test(nums, gpu, extra, timeout, show)
        finally:
            del os.environ["BOOK_TEST_SHARE"]


def _cmd_test(nums: List[int], gpu: bool, extra: List[str], timeout: int, show: bool = False) -> int:
    chapters = load_chapters()
    nums = nums or [c.num for c in chapters]
    total = {"passed": 0, "failed": 0, "skipped": 0}
    failed_chapters = 0
    print(f"{'chapter':>7}  {'passed':>6}  {'failed':>6}  {'skipped':>7}  result (seconds)", flush=True)
    for num in nums:
        root, _, _ = materialise(num, chapters)
        files = sorted(p.relative_to(root).as_posix() for p in (root / "tests").glob(f"test_ch{num:02d}_*.py"))
        counts = {"passed": 0, "failed": 0, "skipped": 0}
        t0 = time.time()
        if not files:
            result, ok = f"no tests/test_ch{num:02d}_*.py", False
        else:
            with tempfile.TemporaryDirectory(prefix=f"minisgl-test-ch{num:02d}-") as tmp:
                report = Path(tmp) / "report.json"
                args = ["-q", "-p", "no:cacheprovider", "--tb=short", "-rfE", *(["-m", "gpu"] if gpu else []),
                        *files, *extra]
                try:
                    proc = subprocess.run([sys.executable, "-c", _PYTEST_BOOT, str(report), *args], cwd=root,
                                          env=_tree_env(root), capture_output=True, text=True, timeout=timeout)
                    rc, out = proc.returncode, proc.stdout + proc.stderr
                except subprocess.TimeoutExpired as e:
                    rc, out = -1, f"timed out after {timeout}s\n{e.stdout or ''}{e.stderr or ''}"
                data = json.loads(report.read_text()) if report.exists() else {"stats": {}, "modules": {}}
            stats = data["stats"]
            counts = {"passed": stats.get("passed", 0) + stats.get("xpassed", 0),
                      "failed": stats.get("failed", 0) + stats.get("error", 0),
                      "skipped": stats.get("skipped", 0) + stats.get("xfailed", 0)}
            outside = sorted(f"{n} from {f}" for n, f in data["modules"].items()
                             if not Path(f).resolve().is_relative_to(root.resolve()))
            if outside:  # 测试必须用到这一章的树，而不是仓库里的 minisgl/ 或装好的包
                rc, out = 1, out + "\nminisgl was not imported from the chapter's tree:\n  " + "\n  ".join(outside)
            elif rc == 0 and "minisgl" not in data["modules"] and sum(counts.values()):
                rc, out = 1, out + "\nthe tests never imported minisgl"
            if rc == 5 and gpu and not counts["failed"]:  # 没有 gpu 测试：pytest 返回 5（没收集到测试）
                rc = 0
            ok = rc == 0
            result = "ok" if ok else f"失败 (pytest exit {rc})"
            if not ok or show:
                print(f"--- ch{num:02d}: pytest {' '.join(args)} (in {root.relative_to(ROOT)}) ---\n{out.rstrip()}",
                      flush=True)
        for k in total:
            total[k] += counts[k]
        failed_chapters += not ok
        print(f"{'ch%02d' % num:>7}  {counts['passed']:>6}  {counts['failed']:>6}  {counts['skipped']:>7}  "
              f"{result} ({time.time() - t0:.1f}s)", flush=True)
    print(f"test{' --gpu' if gpu else ''}: {total['passed']} passed, {total['failed']} failed, "
          f"{total['skipped']} skipped" + (f"; {failed_chapters} chapter(s) failed" if failed_chapters else ""))
    return 1 if failed_chapters else 0


# ----------------------------------------------------------------------------------------------- check
# 在章节树里运行例子：先确认 import 到的 minisgl 来自这棵树（而不是仓库或已安装的包），再按 __main__ 运行
_BOOT = """
import os, runpy, sys
tree, script = sys.argv[1], sys.argv[2]
sys.path = [os.path.dirname(script)] + [p for p in sys.path if p != ""]  # 同 python script.py（-c 加的是 ""）
import minisgl
assert os.path.realpath(minisgl.__file__).startswith(os.path.realpath(tree) + os.sep), \\
    f"minisgl was imported from {minisgl.__file__}, not from {tree}"
sys.argv = [script]
runpy.run_path(script, run_name="__main__")
"""


def _static_check(state, main: str) -> str:
    """'' if chapter N's example compiles and every `minisgl` module (and name) it imports is in chapter N's
    files; else what is missing. Running it is nbval's job (the example cell runs in chapter N's tree)."""
    source = state.content(main)
    try:
        tree = ast.parse(source, main)
    except SyntaxError as e:
        return f"{main}: {e}"
    files = set(state.files("minisgl/"))

    def module_file(mod: str) -> str | None:
        base = mod.replace(".", "/")
        return next((f for f in (base + ".py", base + "/__init__.py") if f in files), None)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods = [(a.name, None) for a in node.names if a.name.split(".")[0] == "minisgl"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "minisgl":
            mods = [(node.module, a.name) for a in node.names]
        else:
            continue
        for mod, name in mods:
            f = module_file(mod)
            if f is None:
                return f"{main} imports {mod}, which chapters 1..N do not make"
            if name and module_file(f"{mod}.{name}") is None and not re.search(rf"\b{re.escape(name)}\b",
                                                                                    state.content(f)):
                return f"{main} imports {name} from {mod}, which {f} does not define as of this chapter"
    return ""


def _flakes(state) -> str:
    """'' if pyflakes finds nothing in chapter N's .py files but unused imports; else its first message (an undefined
    name, a name used before it is assigned...): a name a later chapter's part uses but chapter N's imports lack
    fails here, before any test runs into it."""
    from pyflakes import checker, messages

    for f in sorted(p for p in state.parts if p.endswith(".py")):
        found = checker.Checker(ast.parse(state.content(f), f), filename=f).messages
        bad = sorted((m for m in found if not isinstance(m, messages.UnusedImport)), key=lambda m: m.lineno)
        if bad:
            return str(bad[0])
    return ""


def cmd_check(nums: List[int], timeout: int, static: bool = False) -> int:
    chapters = load_chapters()
    nums = nums or [c.num for c in chapters]
    rows, failed = [], 0
    for num in nums:
        state = build(chapters, num)
        main = f"examples/{chapter_path(num).stem}.py"
        nfiles = len(state.files("minisgl/"))
        if main not in state.parts:
            rows.append((num, nfiles, f"没有 {main}", 0.0))
            failed += 1
            continue
        if static:
            problem = _static_check(state, main) or _flakes(state)
            failed += bool(problem)
            rows.append((num, nfiles, f"失败：{problem}" if problem else f"ok (static: {main})", 0.0))
            continue
        root, _, _ = materialise(num, chapters)
        t0 = time.time()
        try:
            proc = subprocess.run([sys.executable, "-c", _BOOT, str(root), str(root / main)], cwd=root,
                                  env=_tree_env(root), capture_output=True, text=True, timeout=timeout)
            ok, out = proc.returncode == 0, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as e:
            ok, out = False, f"timed out after {timeout}s\n{e.stdout or ''}{e.stderr or ''}"
        dt = time.time() - t0
        result = "ok" if ok else "失败"
        if result != "ok":
            failed += 1
            print(f"--- ch{num:02d} {main} ---\n" + "\n".join(out.splitlines()[-30:]))
        rows.append((num, nfiles, f"{result} ({main})", dt))
    print(f"{'chapter':>7}  {'files':>5}  {'seconds':>7}  result")
    for num, nfiles, result, dt in rows:
        print(f"{'ch%02d' % num:>7}  {nfiles:>5}  {dt:7.1f}  {result}")
    print(f"check: {len(rows) - failed} passed, {failed} failed")
    return 1 if failed else 0


# ----------------------------------------------------------------------------------------------- execute
def cmd_execute(names: List[str], timeout: int, gpu_only: bool, cell_ids: List[str] | None = None) -> int:
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
        if gpu_only or cell_ids:  # 只跑第一个（设置）单元格和选中的单元格，其余单元格的输出原样保留
            first = _first_code(nb)
            keep = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"
                    and (i == first or (gpu_only and "gpu" in c.metadata.get("tags", []))
                         or c.get("id") in (cell_ids or ()))]
            if keep == [first] and nb.cells[first].get("id") not in (cell_ids or ()):
                continue  # 只有设置单元格：这一章没有要跑的
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
        which = ("only cells tagged gpu" if gpu_only else f"only cells {','.join(cell_ids)}" if cell_ids
                 else "all cells" if has_gpu else "cells tagged gpu skipped")
        print(f"executed {path.name} in {time.time() - t0:.0f}s ({'GPU' if has_gpu else 'CPU'}; {which})")
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
    td = sub.add_parser("tree-dir", help="write chapter N's tree to .build/trees/chNN/ and print its path")
    td.add_argument("n", type=chapter_arg, help="5, ch05 or ch05_slug")
    ts = sub.add_parser("test", help="each chapter's tests inside its own tree (pytest args after --)")
    ts.add_argument("n", type=chapter_arg, nargs="*", help="chapters (default: all)")
    ts.add_argument("--gpu", action="store_true", help="only the tests marked gpu (-m gpu)")
    ts.add_argument("--timeout", type=int, default=1800, help="seconds per chapter")
    ts.add_argument("--show-output", action="store_true", help="print pytest's output also when it passes")
    c = sub.add_parser("check", help="run each chapter's example inside chapter N's tree")
    c.add_argument("n", type=chapter_arg, nargs="*", help="chapters (default: all)")
    c.add_argument("--timeout", type=int, default=900)
    c.add_argument("--static", action="store_true",
                   help="only check that each example compiles and imports what chapters 1..N make (nbval runs it)")
    e = sub.add_parser("execute", help="run notebooks with nbclient and store the outputs")
    e.add_argument("names", type=chapter_arg, nargs="*", help="chapters (default: all)")
    e.add_argument("--timeout", type=int, default=1200, help="seconds per cell")
    e.add_argument("--gpu-only", action="store_true", help="run only the setup cell and cells tagged gpu")
    e.add_argument("--cells", default="", help="comma-separated cell ids: run only the setup cell and these")
    p = sub.add_parser("parts", help="list the parts as of chapter N")
    p.add_argument("n", type=chapter_arg, nargs="?")
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if extra and args.cmd != "test":
        ap.error("only `test` takes pytest arguments after --")
    if args.cmd == "tangle":
        return cmd_tangle(args.check)
    if args.cmd == "tree":
        return cmd_tree(args.n)
    if args.cmd == "tree-dir":
        return cmd_tree_dir(args.n)
    if args.cmd == "test":
        return cmd_test(args.n, args.gpu, extra, args.timeout, args.show_output)
    if args.cmd == "check":
        return cmd_check(args.n, args.timeout, args.static)
    if args.cmd == "execute":
        return cmd_execute(args.names, args.timeout, args.gpu_only, [c for c in args.cells.split(",") if c])
    return cmd_parts(args.n)


if __name__ == "__main__":
    sys.exit(main())
