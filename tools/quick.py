#!/usr/bin/env python3
"""The edit-test loop, in minutes: the tangle, the tests of the chapters you touched, their exercises.

    python tools/quick.py                 chapters changed since `main` (and uncommitted or untracked changes)
    python tools/quick.py 9 11            these chapters
    python tools/quick.py --base HEAD~3   chapters changed since that commit

Steps: `steps.py tangle --check` (minisgl/, examples/, tests/ equal the notebooks); `steps.py check --static` (every
chapter's example resolves its imports, and pyflakes finds no undefined name in any chapter's tree); each touched chapter's tests
inside its own tree (`steps.py test N`), one chapter per CPU core at a time, each with one torch thread;
`practice/judge.py --self-check` for the touched chapters' exercises. A chapter is touched when its notebook or
one of its exercises (practice/chNN_*) changed. The whole suite, notebooks included, is `bash tools/test_all.sh`.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import List, Set

from steps import chapter_arg, chapter_paths  # tools/ is on sys.path when this runs as a script

ROOT = Path(__file__).resolve().parent.parent
_TOUCHES = re.compile(r"^(?:book/chapters|practice)/ch(\d\d)_")


def changed_files(base: str) -> List[str]:
    def git(*args: str) -> List[str]:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        return out.splitlines()

    if base == "main" and git("rev-parse", "--abbrev-ref", "HEAD") == ["main"]:
        base = "HEAD"  # on main itself: what is not committed yet
    since = git("merge-base", base, "HEAD")[0] if base != "HEAD" else "HEAD"
    return git("diff", "--name-only", since) + git("ls-files", "--others", "--exclude-standard")


def touched_chapters(files: List[str]) -> List[int]:
    have = {int(p.name[2:4]) for p in chapter_paths()}
    found: Set[int] = {int(m.group(1)) for f in files if (m := _TOUCHES.match(f))}
    return sorted(found & have)


def run(cmd: List[str], env: dict | None = None) -> tuple:
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    return proc.returncode, proc.stdout + proc.stderr, time.time() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("chapters", type=chapter_arg, nargs="*", help="chapters to test (default: the touched ones)")
    ap.add_argument("--base", default="main", help="what 'touched' is measured against (default: main)")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1, help="chapters tested at once")
    args = ap.parse_args()
    nums = args.chapters or touched_chapters(changed_files(args.base))
    py = sys.executable
    rows = []

    rc, out, sec = run([py, "tools/steps.py", "tangle", "--check"])
    print(out.strip().splitlines()[-1] if out.strip() else "tangle --check", flush=True)
    rows.append(("tangle --check", rc, sec))
    if rc:
        print(out)
    rc, out, sec = run([py, "tools/steps.py", "check", "--static"])  # 几秒：每章的例子和 pyflakes
    print(out if rc else out.strip().splitlines()[-1], flush=True)
    rows.append(("check --static", rc, sec))
    if not nums:
        print("no chapter touched (give chapter numbers to test some)")
    env = dict(os.environ, OMP_NUM_THREADS="1")  # 几章同时测：每个进程一个线程，不抢核

    def test(num: int) -> tuple:
        return (num, *run([py, "tools/steps.py", "test", str(num)], env))

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for num, rc, out, sec in pool.map(test, nums):
            lines = out.strip().splitlines()
            print("\n".join(lines if rc else lines[-2:-1]), flush=True)  # 过了只打印这一章的那一行
            rows.append((f"steps.py test {num}", rc, sec))
    with_exercises = [f"ch{n:02d}" for n in nums if any((ROOT / "practice").glob(f"ch{n:02d}_*/exercise.toml"))]
    if with_exercises:
        rc, out, sec = run([py, "practice/judge.py", "--self-check", *with_exercises])
        print(out if rc else out.strip().splitlines()[-1], flush=True)
        rows.append((f"judge.py --self-check {' '.join(with_exercises)}", rc, sec))
    print("\n=== time per step")
    for name, rc, sec in rows:
        print(f"{sec:6.0f}s  {name}{'' if rc == 0 else '  FAILED'}")
    failed = [name for name, rc, _ in rows if rc]
    print(f"{sum(r[2] for r in rows):6.0f}s  total (steps ran side by side: wall time is less)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
