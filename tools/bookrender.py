"""How a chapter notebook looks in the built book (hand-written, not tangled).

MyST-NB reads every `.ipynb` through `read_notebook` (`nb_custom_formats` in `_config.yml`; `local_extensions`
puts tools/ on sys.path and loads this module as a Sphinx extension). The notebook on disk is never changed:

- a code cell's leading `#|` directive lines (`#| file:`, `#| part:`, `#| early`, `#| excerpt`, `#| remove`)
  are dropped, and a caption cell "minisgl/layers/norm.py · RMSNorm" (only the file when there is no part;
  small tags for 提前引入 / 节选 / 本章删除, and 修改 when the listing replaces a part an earlier chapter wrote;
  the directives are parsed by tools/steps.py, the same code that tangles them) is put above the listing;
- an `examples/...` listing that has outputs is split in two, with a "运行结果" label between the code and
  its output, as in the seed chapter;
- a Markdown link into the browser exercises (`[…](../../practice/index.html?ex=…)`: pages Sphinx does
  not build) becomes a raw HTML link;
- the code is highlighted with the IPython lexer (`!pip …`, `%run …`);
- headings get readable ids (their text, `readable_section_ids`) and each page loads every script once
  (`dedupe_scripts`);
- a top-level `<details><summary>T</summary> ... </details>` block in a markdown cell becomes a sphinx-design
  `{dropdown}` titled T, so folded answers look like the theme's other dropdowns (raw <details> also folds,
  but the markdown inside it would be split across several raw-HTML nodes).

Try it on one notebook: `python tools/bookrender.py book/chapters/ch01_skeleton.ipynb` prints the rewritten
cells.
"""
from __future__ import annotations

import copy
import hashlib
import html
import re
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))
import steps  # noqa: E402  (tools/steps.py: the directive parser and the chapter builder)

_DETAILS = re.compile(r"^<details[^>]*>\s*<summary>(.*?)</summary>[ \t]*\n?(.*?)</details>[ \t]*$",
                      re.DOTALL | re.MULTILINE | re.IGNORECASE)
# [文字](../../practice/index.html?ex=…)：练习页不是 Sphinx 生成的页面，普通 Markdown 链接会报 xref_missing
_PRACTICE_LINK = re.compile(r"\[([^\]\n]+)\]\(((?:\.\./)*practice/[^)\s]+)\)")
_TAGS = {"early": "提前引入", "excerpt": "节选", "remove": "本章删除"}
_HIDDEN = {"remove-cell", "remove-input"}


def gpu_note(has_outputs: bool) -> str:
    text = "需要 CUDA，CPU 上跳过" + ("；输出来自 GPU 上的运行" if has_outputs else "")
    return f'<div class="listing-caption gpu-note"><span class="listing-tag gpu">GPU</span> {text}</div>'


def _source(cell) -> str:
    src = cell.get("source", "")
    return src if isinstance(src, str) else "".join(src)


def split_directives(source: str) -> Tuple[steps.Cell | None, str]:
    """A listing cell's directives, parsed by tools/steps.py (the one implementation), and the code to show:
    (Cell or None, the source without its leading `#|` lines)."""
    cell = steps.parse_cell(source, "bookrender")
    lines = source.split("\n")
    i = 0
    while i < len(lines) and lines[i].startswith("#|"):
        i += 1
    return cell, "\n".join(lines[i:]).strip("\n")


def caption_html(cell: steps.Cell, modified: bool = False, gpu: bool = False) -> str:
    text = f'<code class="listing-file">{html.escape(cell.file)}</code>'
    if cell.part and cell.part != cell.file:
        text += f' · <span class="listing-part">{html.escape(cell.part)}</span>'
    for key, label in _TAGS.items():
        if getattr(cell, key):
            text += f' <span class="listing-tag">{label}</span>'
    if modified:  # 替换了前面章节写的同一段
        text += ' <span class="listing-tag modified">修改</span>'
    if gpu:
        text += ' <span class="listing-tag gpu">GPU</span>'
    return f'<div class="listing-caption">{text}</div>'


_CHAPTERS: dict = {}


def _earlier_parts(nb) -> Dict[str, set]:
    """The (file -> parts) that exist before this notebook's chapter, so that a listing repeating one is a 修改.
    The chapter is the one whose listings (as tools/steps.py parses them) are exactly this notebook's."""
    key = tuple((p.name, p.stat().st_mtime) for p in steps.chapter_paths())
    if _CHAPTERS.get("key") != key:
        _CHAPTERS.clear()
        _CHAPTERS.update(key=key, chapters=steps.load_chapters())
    chapters = _CHAPTERS["chapters"]
    mine = []
    for c in nb.cells:
        if c.cell_type == "code" and _source(c).startswith("#|"):
            cell = steps.parse_cell(_source(c), "bookrender")
            if cell is not None:
                mine.append((cell.file, cell.part, cell.body))
    num = next((ch.num for ch in chapters if mine and [(c.file, c.part, c.body) for c in ch.cells] == mine), None)
    if num is None:
        return {}
    before = steps.build(chapters, num - 1, verify=False)
    return {f: set(parts) for f, parts in before.parts.items()}


def _fence(body: str) -> str:
    runs = [len(m.group(0)) for m in re.finditer(r"^[ \t]*(:{3,})", body, re.MULTILINE)]
    return ":" * max([3] + [r + 1 for r in runs])


def details_to_dropdowns(text: str) -> str:
    def repl(m: re.Match) -> str:
        title = re.sub(r"<[^>]+>", "", m.group(1)).strip() or "展开"
        body = m.group(2).rstrip().strip("\n")
        fence = _fence(body)
        return f"{fence}{{dropdown}} {title}\n:class-container: answer\n\n{body}\n{fence}"

    return _DETAILS.sub(repl, text)


def _raw_link(m: re.Match) -> str:
    return f'<a href="{html.escape(m.group(2))}">{html.escape(m.group(1))}</a>'


def _md(source: str, cid: str):
    cell = nbformat.v4.new_markdown_cell(source)
    cell["id"] = cid[:64]
    return cell


def settle_streams(outputs: List) -> List:
    """像终端那样显示流输出：相邻的同名流合并，一行里 \\r 之前被覆盖的部分（tqdm 的中间状态）丢掉。"""
    out: List = []
    for o in outputs:
        if o.get("output_type") == "stream" and out and out[-1].get("output_type") == "stream" \
                and out[-1].get("name") == o.get("name"):
            out[-1]["text"] = _source_text(out[-1]) + _source_text(o)
            continue
        out.append(copy.deepcopy(o))
    for o in out:
        if o.get("output_type") == "stream":
            lines = _source_text(o).split("\n")
            o["text"] = "\n".join(line.rstrip("\r").rsplit("\r", 1)[-1] for line in lines)
    return out


def _source_text(o) -> str:
    t = o.get("text", "")
    return t if isinstance(t, str) else "".join(t)


def render(nb):
    """Rewrite the cells of a notebook for display (a new notebook; the argument is not changed)."""
    nb = copy.deepcopy(nb)
    # `!cmd` 和 `%magic` 只有 IPython 词法分析器认识；tools/nb.py 写的 language_info 只有 name
    info = nb.metadata.setdefault("language_info", {})
    if info.get("name", "python") == "python":
        info["name"] = "python"
        info["pygments_lexer"] = "ipython3"
    earlier = _earlier_parts(nb)
    cells: List = []
    for n, cell in enumerate(nb.cells):
        cid = str(cell.get("id") or f"cell{n}")
        if cell.cell_type == "markdown":
            src = _source(cell)
            if "<details" in src.lower():
                src = details_to_dropdowns(src)
            if "practice/" in src:
                src = _PRACTICE_LINK.sub(_raw_link, src)
            cell["source"] = src
            cells.append(cell)
            continue
        if cell.cell_type != "code":
            cells.append(cell)
            continue
        tags = set(cell.get("metadata", {}).get("tags", []))
        if cell.get("outputs"):
            cell["outputs"] = settle_streams(cell["outputs"])
        if not _source(cell).startswith("#|"):
            if "gpu" in tags and not tags & _HIDDEN:  # 只在 GPU 上运行的演示单元格：标出来，输出来自 GPU
                cells.append(_md(gpu_note(bool(cell.get("outputs"))), cid + "-gpu"))
            cells.append(cell)
            continue
        listing, body = split_directives(_source(cell))
        cell["source"] = body
        if listing is None or tags & _HIDDEN:
            cells.append(cell)
            continue
        modified = not (listing.excerpt or listing.remove) and listing.part in earlier.get(listing.file, ())
        cells.append(_md(caption_html(listing, modified, gpu="gpu" in tags), cid + "-cap"))
        outputs = cell.get("outputs") or []
        if listing.file.startswith("examples/") and outputs and "remove-output" not in tags:
            result = copy.deepcopy(cell)
            result["id"] = (cid + "-out")[:64]
            result.setdefault("metadata", {})["tags"] = sorted(tags | {"remove-input"})
            cell["outputs"] = []
            cells.append(cell)
            cells.append(_md('<div class="output-label">运行结果</div>', cid + "-lbl"))
            cells.append(result)
        else:
            cells.append(cell)
    nb.cells = cells
    return nb


def read_notebook(text: str):
    """MyST-NB reader (nb_custom_formats): notebook text -> the notebook as the book shows it."""
    return render(nbformat.reads(text, as_version=4))


def readable_section_ids(app, doctree) -> None:
    """A heading's id is its MyST slug (`myst_heading_anchors`: the heading text, GitHub style, e.g.
    `#自测能答上来就可以跳过本章`) instead of docutils' `#id1` for non-ASCII titles; the old id stays as a second
    anchor. Runs before Sphinx's toc collector (priority < 500), so the sidebar links use the new ids."""
    from docutils import nodes

    for section in doctree.findall(nodes.section):
        slug = section.get("slug")
        if not slug or not section["ids"] or section["ids"][0] == slug:
            continue
        new, i = slug, 1
        while new in doctree.ids:
            new, i = f"{slug}-{i}", i + 1
        section["ids"].insert(0, new)
        doctree.ids[new] = section


def dedupe_scripts(app, pagename, templatename, context, doctree) -> None:
    """sphinx-thebe adds its inline `const THEBE_JS_URL = …` script twice (its env-before-read-docs handler
    registers it with the app and with the builder), which throws "Identifier 'THEBE_JS_URL' has already been
    declared" on every page: keep the first copy of each script (same file and attributes, any priority)."""
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, kept = set(), []
    for js in scripts:
        attributes = sorted((k, str(v)) for k, v in getattr(js, "attributes", {}).items())
        key = (getattr(js, "filename", None) or "", repr(attributes))  # 同一段脚本：文件名是 None 或 ""
        if key not in seen:
            seen.add(key)
            kept.append(js)
    scripts[:] = kept


def setup(app):
    # 本文件（或 tools/steps.py、book/_static/ 里的 CSS/JS）一改，Sphinx 就要重新读、重新写所有页面（config 值变了
    # → 环境失效）；否则只改了 CSS 时 Sphinx 说 "no targets are out of date"，连静态文件都不拷
    here = Path(__file__).resolve().parent
    sources = [Path(__file__), here / "steps.py"] + sorted((here.parent / "book" / "_static").glob("*"))
    digest = hashlib.sha1(b"".join(p.read_bytes() for p in sources if p.is_file())).hexdigest()[:12]
    app.add_config_value("bookrender_digest", digest, "env")
    app.connect("doctree-read", readable_section_ids, priority=400)
    app.connect("html-page-context", dedupe_scripts, priority=900)  # after the handlers that add scripts
    return {"version": digest, "parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":
    for path in sys.argv[1:]:
        shown = render(nbformat.read(path, as_version=4))
        for c in shown.cells:
            tags = c.get("metadata", {}).get("tags", [])
            print(f"--- {c.cell_type} {tags or ''} ({len(c.get('outputs', []))} outputs)")
            print(_source(c)[:600])
