#!/usr/bin/env python3
"""组装浏览器练习页：python tools/build_practice_web.py OUT [--offline]

OUT 里会有：
  index.html, worker.mjs   来自 practice/web/
  exercises.json           每个 browser = true 的练习：题目（Markdown 和渲染好的 HTML）、stub、测试、所在的章
                           （标题和回到那一章"本章练习题"的链接）；以及 wheel 列表
  pyodide/                 npm 包 pyodide 的核心文件（约 14 MB，CPython 编译成 WebAssembly）
  wheels/                  pytest 和它的依赖（PyPI 上的纯 Python wheel），在浏览器里解压进 site-packages

pyodide 和 wheels 只下载一次，缓存在 practice/.cache/（git 忽略）。--offline 只用缓存。参考答案从不放进去。
tools/book.py build 把 OUT 设成 _build/html/practice：那时书已经构建好，章的链接会带上"本章练习题"一节的锚点。
测试：node tools/test_practice_web.mjs _build/html（无头 Chromium 做每一道题）。

用本地 HTTP 服务打开（file:// 不行）：python -m http.server -d OUT 8000，然后访问
http://127.0.0.1:8000/?ex=ch01_registry
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRACTICE = ROOT / "practice"
CACHE = PRACTICE / ".cache"

PYODIDE_VERSION = "314.0.7"  # CPython 3.14
# pytest 9 在 Pyodide 里需要这些（都是纯 Python wheel）；版本和 shared/reference/book-anchors.md §4.2 验证过的一致
WHEELS = ["pytest==9.0.2", "pluggy==1.6.0", "iniconfig==2.3.0", "packaging==26.1", "pygments==2.19.2"]
# npm 包里运行时需要的文件（其余是类型声明、README 等）
PYODIDE_SUFFIXES = (".mjs", ".js", ".wasm", ".zip", ".json")
PYODIDE_SKIP = {"package.json"}


def log(msg: str) -> None:
    print(f"[build_practice_web] {msg}", flush=True)


def fetch_pyodide(offline: bool) -> Path:
    """npm pack pyodide@VERSION → 解开到 practice/.cache/pyodide-VERSION/package/。"""
    dest = CACHE / f"pyodide-{PYODIDE_VERSION}"
    pkg = dest / "package"
    if (pkg / "pyodide.mjs").exists():
        return pkg
    if offline:
        sys.exit(f"--offline：缓存里没有 pyodide {PYODIDE_VERSION}（{pkg}）")
    if shutil.which("npm") is None:
        sys.exit("需要 npm 来下载 pyodide（或者先在有 npm 的机器上构建一次，再复制 practice/.cache/）")
    dest.mkdir(parents=True, exist_ok=True)
    log(f"npm pack pyodide@{PYODIDE_VERSION} …")
    out = subprocess.run(["npm", "pack", f"pyodide@{PYODIDE_VERSION}", "--silent"], cwd=dest,
                         check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    tgz = dest / out
    with tarfile.open(tgz) as tar:
        members = [m for m in tar.getmembers() if m.isfile() and m.name.startswith("package/")]
        try:
            tar.extractall(dest, members=members, filter="data")
        except TypeError:  # Python < 3.11.4 没有 filter 参数
            tar.extractall(dest, members=members)
    tgz.unlink()
    return pkg


def fetch_wheels(offline: bool) -> list[Path]:
    dest = CACHE / "wheels"
    dest.mkdir(parents=True, exist_ok=True)

    def find(spec: str) -> Path | None:
        name, version = spec.split("==")
        hits = sorted(dest.glob(f"{name.replace('-', '_')}-{version}-*.whl"))
        return hits[0] if hits else None

    missing = [s for s in WHEELS if find(s) is None]
    if missing:
        if offline:
            sys.exit(f"--offline：缓存里没有这些 wheel：{', '.join(missing)}")
        log(f"pip download {' '.join(missing)} …")
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                        "--python-version", "3.14", "--implementation", "py", "-d", str(dest), *missing], check=True)
    paths = [find(s) for s in WHEELS]
    if any(p is None for p in paths):
        sys.exit(f"pip download 之后还是找不到：{[s for s, p in zip(WHEELS, paths) if p is None]}")
    return paths  # type: ignore[return-value]


def render_markdown(text: str) -> str | None:
    try:
        from markdown_it import MarkdownIt  # jupyter-book / myst-parser 自带
    except ModuleNotFoundError:
        return None  # 页面退回到 <pre> 显示
    return MarkdownIt("commonmark", {"html": False}).enable("table").render(text)


def chapter_info(site: Path) -> dict[str, dict]:
    """chNN → {"chapter_title": 章标题, "chapter_url": 从练习页回到那一章（"本章练习题"一节）的相对链接}。

    章标题取 notebook 里第一个一级标题；site 是书的 HTML 根目录（练习页在 site/practice/），
    章的页面已经构建好时，从里面找"本章练习题"那一节的 id 当锚点。
    """
    info = {}
    for nb in sorted((ROOT / "book" / "chapters").glob("ch[0-9][0-9]_*.ipynb")):
        cells = json.loads(nb.read_text(encoding="utf-8")).get("cells", [])
        title = ""
        for cell in cells:
            if cell.get("cell_type") != "markdown":
                continue
            heading = next((l[2:].strip() for l in "".join(cell["source"]).splitlines() if l.startswith("# ")), "")
            if heading:
                title = re.sub(r"^第\s*\d+\s*章\s*[:：·]?\s*", "", heading)
                break
        page = site / "book" / "chapters" / f"{nb.stem}.html"
        url = f"../book/chapters/{nb.stem}.html"
        if page.exists():
            m = re.search(r'<section id="([^"]+)">\s*<h2>本章练习题', page.read_text(encoding="utf-8"))
            if m:
                url += f"#{m.group(1)}"
        info[nb.name[:4]] = {"chapter_title": title, "chapter_url": url}
    return info


def collect_exercises(chapters: dict[str, dict]) -> list[dict]:
    sys.path.insert(0, str(PRACTICE))
    import judge  # practice/judge.py：同一套发现逻辑和 browser 标记检查

    out = []
    for ex in judge.discover():
        if not ex.browser:
            continue
        problems = judge.browser_problems(ex)
        if problems:
            sys.exit("browser = true 不属实：\n  " + "\n  ".join(problems))
        readme = (ex.dir / "README.md").read_text(encoding="utf-8")
        item = {
            "name": ex.name,
            "title": ex.title,
            "chapter": ex.chapter,
            "module": ex.module,
            "readme": readme,
            "readme_html": render_markdown(readme),
            "stub": (ex.dir / "stub.py").read_text(encoding="utf-8"),
            "tests": (ex.dir / "test_exercise.py").read_text(encoding="utf-8"),
            **chapters.get(ex.chapter, {"chapter_title": "", "chapter_url": ""}),
        }
        out.append(item)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="输出目录，例如 book/_build/html/practice")
    ap.add_argument("--offline", action="store_true", help="不下载，只用 practice/.cache/ 里的缓存")
    args = ap.parse_args()
    t0 = time.monotonic()

    out: Path = args.out
    exercises = collect_exercises(chapter_info(out.resolve().parent))
    pyodide = fetch_pyodide(args.offline)
    wheels = fetch_wheels(args.offline)

    out.mkdir(parents=True, exist_ok=True)
    for name in ("index.html", "worker.mjs"):
        shutil.copyfile(PRACTICE / "web" / name, out / name)
    (out / "pyodide").mkdir(exist_ok=True)
    for f in sorted(pyodide.iterdir()):
        if f.is_file() and f.name.endswith(PYODIDE_SUFFIXES) and f.name not in PYODIDE_SKIP:
            shutil.copyfile(f, out / "pyodide" / f.name)
    (out / "wheels").mkdir(exist_ok=True)
    for w in wheels:
        shutil.copyfile(w, out / "wheels" / w.name)
    manifest = {
        "pyodide": PYODIDE_VERSION,
        "book_url": "../index.html",  # 书的首页（练习页在 _build/html/practice/）
        "wheels": [w.name for w in wheels],
        "exercises": exercises,
    }
    (out / "exercises.json").write_text(json.dumps(manifest, ensure_ascii=False, indent=1), encoding="utf-8")
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) / 2**20
    log(f"{len(exercises)} 个浏览器练习 → {out}（{size:.1f} MB，{time.monotonic() - t0:.1f} 秒）")
    log(f"预览：python -m http.server -d {out} 8000 → http://127.0.0.1:8000/?ex={exercises[0]['name'] if exercises else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
