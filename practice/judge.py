#!/usr/bin/env python3
"""本地判题：python practice/judge.py [chNN | chNN_name ...] [--solution PATH] [--reference] [--self-check]

默认判你的工作副本 practice/work/<练习名>.py（第一次运行时从 stub.py 复制过去，之后只改那个文件）。
每个练习在自己的临时目录里、单独的 pytest 子进程中运行：被测文件被复制成 <module>.py（默认 solution.py），
旁边只有这个练习的 test_exercise.py，练习之间互相看不见。

  --solution PATH   判指定的文件（只能配合一个练习）
  --reference       判参考答案 solution.py
  --self-check      给 CI 用：参考答案必须全部通过、原样的 stub 必须失败、browser 标记必须属实
  --list            列出所有练习
  -v                失败时打印 pytest 的完整输出

退出码：0 全部通过；1 有失败；2 用法错误（例如不认识的章节）。
"""
from __future__ import annotations

import argparse
import ast
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import json
import unicodedata
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10：pyproject 的依赖里有 tomli（同一个 API）
    import tomli as tomllib

PRACTICE = Path(__file__).resolve().parent
WORK = PRACTICE / "work"
EX_FILES = ("README.md", "exercise.toml", "stub.py", "solution.py", "test_exercise.py")
NAME_RE = re.compile(r"^ch(\d\d)_[a-z0-9_]+$")
N_CHAPTERS = 17  # 第 16、17 号是附录（ch16_scale、ch17_structured）

# 浏览器里（Pyodide）除了标准库，只额外提供 pytest
BROWSER_EXTRA = {"pytest", "_pytest"}
# 标准库里 Pyodide 没有或者用不了的模块（在 Pyodide 314.0.7 里逐个 import 核实过）
PYODIDE_MISSING = {
    # import 就失败
    "tkinter", "turtle", "turtledemo", "venv", "ensurepip", "idlelib", "pydoc_data", "curses", "readline",
    "dbm", "resource", "test",
    # 能 import，但用不了：不能开线程/子进程，没有网络 socket
    "multiprocessing", "subprocess", "threading", "_thread", "concurrent", "socket", "socketserver", "ssl",
    "webbrowser",
    # Python 3.12/3.13 删掉的模块（本地 Python 可能还有，Pyodide 的 3.14 没有）
    "distutils", "imp", "asynchat", "asyncore", "smtpd", "imghdr", "cgi", "cgitb", "telnetlib", "nntplib",
    "pipes", "crypt", "audioop", "chunk", "mailcap", "msilib", "nis", "ossaudiodev", "sndhdr", "spwd", "sunau",
    "uu", "xdrlib", "lib2to3",
}


# ---------------------------------------------------------------------------------------------------
# 练习的发现与元数据


def _load_toml(path: Path) -> dict:
    with open(path, "rb") as f:
        return tomllib.load(f)


@dataclass
class Exercise:
    name: str
    dir: Path
    meta: dict

    @property
    def chapter(self) -> str:
        return self.name[:4]

    @property
    def module(self) -> str:
        return self.meta.get("module", "solution")

    @property
    def browser(self) -> bool:
        return bool(self.meta.get("browser", False))

    @property
    def title(self) -> str:
        return self.meta.get("title", self.name)

    @property
    def timeout(self) -> int:
        return int(self.meta.get("timeout", 120))

    @property
    def work_file(self) -> Path:
        return WORK / f"{self.name}.py"


def discover() -> List[Exercise]:
    found = []
    for d in sorted(PRACTICE.iterdir()):
        if d.is_dir() and NAME_RE.match(d.name) and (d / "exercise.toml").exists():
            found.append(Exercise(d.name, d, _load_toml(d / "exercise.toml")))
    found.sort(key=lambda e: (e.chapter, e.meta.get("order", 99), e.name))
    return found


def select(exercises: List[Exercise], selectors: List[str]) -> List[Exercise]:
    """chNN / N / NN 选一章的全部练习，chNN_name 选一个练习。不认识的选择器 → SystemExit(2)。"""
    if not selectors:
        return exercises
    chosen: List[Exercise] = []
    for sel in selectors:
        s = sel.strip().lower().rstrip("/")
        s = s.split("/")[-1]  # 允许 practice/ch01_registry
        if re.fullmatch(r"\d{1,2}", s):
            s = f"ch{int(s):02d}"
        if re.fullmatch(r"ch\d{2}", s):
            hits = [e for e in exercises if e.chapter == s]
            if not hits:
                n = int(s[2:])
                if 1 <= n <= N_CHAPTERS:
                    _usage_error(f"第 {n} 章（{s}）还没有练习题。{_known(exercises)}")
                _usage_error(f"没有 {sel!r} 这一章（全书 ch01–ch{N_CHAPTERS:02d}）。{_known(exercises)}")
        else:
            hits = [e for e in exercises if e.name == s]
            if not hits:
                _usage_error(f"不认识的练习 {sel!r}。{_known(exercises)}")
        chosen += [e for e in hits if e not in chosen]
    return chosen


def _known(exercises: List[Exercise]) -> str:
    by_ch: Dict[str, List[str]] = {}
    for e in exercises:
        by_ch.setdefault(e.chapter, []).append(e.name)
    listing = "; ".join(f"{ch}: {', '.join(names)}" for ch, names in by_ch.items())
    return f"已有的练习 —— {listing}" if listing else "practice/ 下还没有任何练习。"


def _usage_error(msg: str) -> None:
    print(f"judge.py: {msg}", file=sys.stderr)
    raise SystemExit(2)


# ---------------------------------------------------------------------------------------------------
# 运行一个练习的测试


@dataclass
class TestResult:
    name: str
    outcome: str  # passed / failed / error / skipped
    reason: str = ""


@dataclass
class Outcome:
    exercise: Exercise
    target: Path
    rc: int
    seconds: float
    tests: List[TestResult] = field(default_factory=list)
    note: str = ""  # 收集失败、超时、没有测试等
    output: str = ""

    @property
    def passed(self) -> int:
        return sum(t.outcome == "passed" for t in self.tests)

    @property
    def total(self) -> int:
        return sum(t.outcome != "skipped" for t in self.tests)

    @property
    def ok(self) -> bool:
        return self.rc == 0 and self.total > 0 and self.passed == self.total

    @property
    def failures(self) -> List[TestResult]:
        return [t for t in self.tests if t.outcome in ("failed", "error")]


def _first_line(text: str, limit: int = 160) -> str:
    lines = [ln.strip() for ln in (text or "").strip().splitlines() if ln.strip()]
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _error_line(text: str) -> str:
    """从 traceback 文本里找最像“原因”的一行（E   ... 或者最后一行）。"""
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith("E ") and ("Error" in ln or "Exception" in ln):
            return _first_line(ln[1:])
    return _first_line(lines[-1]) if lines else ""


def run_exercise(ex: Exercise, target: Path) -> Outcome:
    """在临时目录里把 target 放成 <module>.py，跑 test_exercise.py。"""
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"judge_{ex.name}_") as tmp:
        tmpd = Path(tmp)
        shutil.copyfile(target, tmpd / f"{ex.module}.py")
        shutil.copyfile(ex.dir / "test_exercise.py", tmpd / "test_exercise.py")
        shutil.copyfile(PRACTICE / "judge_report.py", tmpd / "judge_report.py")
        (tmpd / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
        report = tmpd / "report.jsonl"
        cmd = [
            sys.executable, "-m", "pytest", "test_exercise.py", "-q", "-rN", "-p", "judge_report",
            "-p", "no:cacheprovider", "-c", str(tmpd / "pytest.ini"), "--rootdir", str(tmpd),
        ]
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")}
        env.update(PYTHONDONTWRITEBYTECODE="1", PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", PYTHONIOENCODING="utf-8",
                   JUDGE_REPORT=str(report))
        try:
            proc = subprocess.run(cmd, cwd=tmpd, env=env, capture_output=True, text=True,
                                  encoding="utf-8", errors="replace", timeout=ex.timeout)
        except subprocess.TimeoutExpired as exc:
            out = (exc.stdout or "") if isinstance(exc.stdout, str) else ""
            tests = _read_report(report)  # 超时前跑完的测试照常计分
            hung = [TestResult(name, "failed", f"超时：{ex.timeout} 秒内没有跑完") for name in _unfinished(report)]
            where = f"，卡在 {hung[0].name}" if hung else ""
            return Outcome(ex, target, 124, time.monotonic() - t0, tests + hung,
                           note=f"超时：{ex.timeout} 秒内没有跑完（死循环？）{where}", output=out)
        # 报告里的临时路径换回被测文件的真实路径
        shown = (str(tmpd / f"{ex.module}.py"), _rel(target))
        output = (proc.stdout + proc.stderr).replace(*shown)
        tests = _read_report(report)
        for t in tests:
            t.reason = t.reason.replace(*shown)
    outcome = Outcome(ex, target, proc.returncode, time.monotonic() - t0, tests, output=output)
    if proc.returncode == 5:
        outcome.note = "没有收集到任何测试（test_exercise.py 里没有 test_ 函数？）"
    elif any(t.name == "<collection>" for t in tests) or (proc.returncode in (2, 3, 4) and not tests):
        err = next((t.reason for t in tests if t.name == "<collection>"), "") or _error_line(output)
        outcome.note = _syntax_error(target) or f"收集失败（导入 {ex.module}.py 时出错？加 -v 看完整输出）：{err}"
        outcome.tests = [t for t in tests if t.name != "<collection>"]
    return outcome


def _syntax_error(target: Path) -> str:
    """被测文件本身有语法错误时，说出第几行、哪一行、错在哪一列（pytest 的一行摘要里没有行号）。"""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # 比如无效的转义序列：只是警告，不是这里要报的
            compile(target.read_bytes(), str(target), "exec", dont_inherit=True)
    except SyntaxError as exc:
        msg = f"语法错误：{_rel(target)} 第 {exc.lineno} 行：{type(exc).__name__}: {exc.msg}"
        line = (exc.text or "").splitlines()[0] if (exc.text or "").strip() else ""
        if line:
            indent = len(line) - len(line.lstrip())
            msg += f"\n  {line.strip()}"
            if exc.offset and exc.offset - 1 >= indent:
                msg += "\n  " + " " * (exc.offset - 1 - indent) + "^"
        return msg
    except (ValueError, OSError):  # 空字节等：交给 pytest 的报告
        return ""
    return ""


def _read_report(path: Path) -> List[TestResult]:
    """judge_report.py（pytest 插件）每个测试写一行 JSON：名字、结果、原因。"""
    return [TestResult(r["name"], r["outcome"], _first_line(r["reason"]) or _error_line(r["text"]))
            for r in _report_rows(path) if r["outcome"] != "started"]


def _report_rows(path: Path) -> List[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _unfinished(path: Path) -> List[str]:
    """开始了、没有结果的测试（超时时是卡住的那个）。"""
    rows = _report_rows(path)
    done = {r["name"] for r in rows if r["outcome"] != "started"}
    return [r["name"] for r in rows if r["outcome"] == "started" and r["name"] not in done]


def run_many(jobs: List[Tuple[Exercise, Path]]) -> List[Outcome]:
    workers = max(1, min(len(jobs), os.cpu_count() or 1, 4))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda job: run_exercise(*job), jobs))


# ---------------------------------------------------------------------------------------------------
# 输出


def _width(s: str) -> int:
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in s)


def _pad(s: str, w: int) -> str:
    return s + " " * max(0, w - _width(s))


def _color(s: str, code: str) -> str:
    if not sys.stdout.isatty() or os.environ.get("NO_COLOR"):
        return s
    return f"\033[{code}m{s}\033[0m"


def print_table(outcomes: List[Outcome], verbose: bool = False) -> None:
    rows = [("练习", "通过", "结果", "秒")]
    for o in outcomes:
        result = "通过" if o.ok else ("超时" if o.rc == 124 else "失败")
        rows.append((o.exercise.name, f"{o.passed}/{o.total}" if o.total else "-", result, f"{o.seconds:.1f}"))
    widths = [max(_width(r[i]) for r in rows) for i in range(4)]
    for i, r in enumerate(rows):
        line = "  ".join(_pad(c, widths[j]) for j, c in enumerate(r)).rstrip()
        if i == 0:
            print(line)
            print("  ".join("-" * w for w in widths))
        else:
            print(_color(line, "32" if outcomes[i - 1].ok else "31"))
    for o in outcomes:
        if o.ok:
            continue
        print()
        print(_color(f"✗ {o.exercise.name}", "31") + f"  （被测文件：{_rel(o.target)}）")
        if o.note:
            print("  " + o.note.replace("\n", "\n  "))
        groups: Dict[str, List[str]] = {}
        for t in o.failures:  # 同一个原因的失败合成一行
            groups.setdefault(t.reason, []).append(t.name)
        for reason, names in groups.items():
            if len(names) == 1:
                print(f"  - {names[0]}: {reason}")
            else:
                shown = ", ".join(names[:3]) + (f" 等 {len(names)} 个" if len(names) > 3 else "")
                print(f"  - {reason}\n      ← {shown}")
        if verbose and o.output:
            print("  ---- pytest 输出 ----")
            print("\n".join("  " + ln for ln in o.output.rstrip().splitlines()))


def _rel(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(p)


# ---------------------------------------------------------------------------------------------------
# --self-check：参考答案全过、stub 失败、browser 标记属实、stub 和参考答案的接口一致


def imports_of(path: Path) -> List[Tuple[str, int]]:
    """文件里 import 的顶层模块名（含函数体内的 import）；相对导入记为 '.'。"""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    mods = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods += [(a.name.split(".")[0], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mods.append(("." if node.level else (node.module or "").split(".")[0], node.lineno))
        elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) in (
            "__import__", "import_module",
        ):
            mods.append(("<dynamic import>", node.lineno))
    return mods


def browser_problems(ex: Exercise) -> List[str]:
    """browser = true 的练习：stub、测试（和参考答案）只能 import Pyodide 里有的标准库 + pytest + 被测模块。"""
    stdlib = set(sys.stdlib_module_names)
    problems = []
    for fname in ("stub.py", "test_exercise.py", "solution.py"):
        for mod, line in imports_of(ex.dir / fname):
            if mod in (ex.module, "__future__") or mod in BROWSER_EXTRA:
                continue
            where = f"{ex.name}/{fname}:{line}"
            if mod == "." or mod == "<dynamic import>":
                problems.append(f"{where}: {mod} 无法静态确认是标准库")
            elif mod not in stdlib:
                problems.append(f"{where}: import {mod} 不是标准库")
            elif mod in PYODIDE_MISSING:
                problems.append(f"{where}: import {mod} 是标准库，但 Pyodide 里不能用")
    return problems


def api_problems(ex: Exercise) -> List[str]:
    """stub.py 必须定义和 solution.py 一样的公开函数/类/方法，参数名也一样。"""

    def api(path: Path) -> Dict[str, List[str]]:
        out: Dict[str, List[str]] = {}
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
                out[node.name] = [a.arg for a in node.args.args + node.args.kwonlyargs]
            elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                out[node.name] = []
                for sub in node.body:
                    if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                        not sub.name.startswith("_") or (sub.name.startswith("__") and sub.name.endswith("__"))
                    ):
                        out[f"{node.name}.{sub.name}"] = [a.arg for a in sub.args.args + sub.args.kwonlyargs]
        return out

    ref, stub = api(ex.dir / "solution.py"), api(ex.dir / "stub.py")
    problems = []
    for name, args in ref.items():
        if name not in stub:
            problems.append(f"{ex.name}/stub.py 缺少 {name}（参考答案里有）")
        elif stub[name] != args:
            problems.append(f"{ex.name}/stub.py 的 {name}({', '.join(stub[name])}) 与参考答案的参数 ({', '.join(args)}) 不同")
    return problems


def format_problems(ex: Exercise) -> List[str]:
    problems = [f"{ex.name}/ 缺少 {f}" for f in EX_FILES if not (ex.dir / f).exists()]
    if problems:
        return problems
    if ex.meta.get("chapter") != ex.chapter:
        problems.append(f"{ex.name}/exercise.toml: chapter = {ex.meta.get('chapter')!r}，应为 {ex.chapter!r}")
    if not isinstance(ex.meta.get("title"), str) or not ex.meta["title"].strip():
        problems.append(f"{ex.name}/exercise.toml: 缺少 title")
    if not isinstance(ex.meta.get("browser"), bool):
        problems.append(f"{ex.name}/exercise.toml: browser 必须是 true 或 false")
    for fname in ("stub.py", "solution.py", "test_exercise.py"):
        try:
            ast.parse((ex.dir / fname).read_text(encoding="utf-8"))
        except SyntaxError as exc:
            problems.append(f"{ex.name}/{fname}: 语法错误 {exc}")
    if "NotImplementedError" not in (ex.dir / "stub.py").read_text(encoding="utf-8"):
        problems.append(f"{ex.name}/stub.py 里没有 raise NotImplementedError(...)")
    return problems


def self_check(exercises: List[Exercise]) -> int:
    problems: List[str] = []
    notes: List[str] = []
    checked = []
    for ex in exercises:
        p = format_problems(ex)
        problems += p
        if not p:
            checked.append(ex)
            problems += api_problems(ex)
            bp = browser_problems(ex)
            if ex.browser:
                problems += [f"browser = true 不属实：{x}" for x in bp]
            elif not bp:
                notes.append(f"{ex.name}: 只用了标准库，可以设 browser = true")
    t0 = time.monotonic()
    jobs = [(ex, ex.dir / "solution.py") for ex in checked] + [(ex, ex.dir / "stub.py") for ex in checked]
    results = run_many(jobs)
    refs, stubs = results[: len(checked)], results[len(checked):]
    print("参考答案（必须全部通过）：")
    print_table(refs)
    for o in refs:
        if not o.ok:
            problems.append(f"{o.exercise.name}: 参考答案没有全部通过（{o.passed}/{o.total}）{o.note}")
        elif o.total < 3:
            problems.append(f"{o.exercise.name}: 只有 {o.total} 个测试，至少要 3 个")
    print()
    print("原样的 stub（必须失败）：")
    rows = []
    for o in stubs:
        if o.ok or (o.total > 0 and o.passed == o.total):
            problems.append(f"{o.exercise.name}: 原样的 stub 居然通过了全部测试")
        elif o.note and not o.tests:
            problems.append(f"{o.exercise.name}: stub 无法运行测试：{o.note}")
        else:
            for t in o.tests:
                if t.outcome == "passed":
                    notes.append(f"{o.exercise.name}: 测试 {t.name} 对原样的 stub 也通过（它真的在检查练习吗？）")
        rows.append(f"  {o.exercise.name}: stub 通过 {o.passed}/{o.total}")
    print("\n".join(rows))
    print()
    for n in notes:
        print(f"注意：{n}")
    if problems:
        print(_color(f"self-check 失败（{len(problems)} 个问题）：", "31"))
        for p in problems:
            print(f"  - {p}")
        return 1
    n_browser = sum(ex.browser for ex in checked)
    print(_color(f"self-check 通过：{len(checked)} 个练习（浏览器 {n_browser} 个），"
                 f"{len(jobs)} 次 pytest，{time.monotonic() - t0:.1f} 秒", "32"))
    return 0


# ---------------------------------------------------------------------------------------------------


def ensure_work_copy(ex: Exercise) -> Tuple[Path, bool]:
    """第一次判题时把 stub.py 复制到 practice/work/<name>.py；以后只判这个文件（不会覆盖）。"""
    if ex.work_file.exists():
        return ex.work_file, False
    WORK.mkdir(exist_ok=True)
    shutil.copyfile(ex.dir / "stub.py", ex.work_file)
    return ex.work_file, True


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python practice/judge.py",
        description="本地判题。默认判 practice/work/<练习>.py（第一次运行时从 stub 复制）。",
    )
    parser.add_argument("which", nargs="*", help="chNN（一章的全部练习）、chNN_name（一个练习）或章号；默认全部")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--solution", metavar="PATH", help="判指定的文件（只能配合一个练习）")
    mode.add_argument("--reference", action="store_true", help="判参考答案 solution.py")
    mode.add_argument("--self-check", action="store_true", help="CI：参考答案全过、stub 失败、browser 标记属实")
    mode.add_argument("--list", action="store_true", help="列出所有练习")
    parser.add_argument("-v", "--verbose", action="store_true", help="失败时打印 pytest 的完整输出")
    args = parser.parse_args(argv)

    exercises = discover()
    chosen = select(exercises, args.which)
    if not chosen:
        _usage_error("practice/ 下还没有任何练习。")

    if args.list:
        for ex in chosen:
            flag = "浏览器 + 本地" if ex.browser else "本地"
            print(f"{ex.name:<28} {_pad(flag, 14)} {ex.title}")
        return 0
    if args.self_check:
        return self_check(chosen)

    if args.solution:
        if len(chosen) != 1:
            names = ", ".join(e.name for e in chosen)
            _usage_error(f"--solution 只能配合一个练习（现在选中了 {names}），例如：judge.py {chosen[0].name} --solution {args.solution}")
        target = Path(args.solution)
        if not target.is_file():
            _usage_error(f"找不到文件 {args.solution}")
        jobs = [(chosen[0], target)]
    elif args.reference:
        jobs = [(ex, ex.dir / "solution.py") for ex in chosen]
    else:
        jobs = []
        for ex in chosen:
            path, created = ensure_work_copy(ex)
            if created:
                print(f"已创建 {_rel(path)}（从 {ex.name}/stub.py 复制）：在这个文件里写你的实现。题目见 {_rel(ex.dir / 'README.md')}")
            jobs.append((ex, path))
    outcomes = run_many(jobs)
    print_table(outcomes, verbose=args.verbose)
    ok = all(o.ok for o in outcomes)
    if ok:
        print()
        print(_color(f"全部通过（{len(outcomes)} 个练习）。", "32"))
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # judge.py ... | head
        sys.stderr.close()
        sys.exit(1)
