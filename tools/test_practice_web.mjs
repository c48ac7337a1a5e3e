// 在无头 Chromium 里读一遍书（每一页离线可读、公式排好）并做一遍浏览器练习页上的每一道题（CI：tools/test_all.sh
// 在构建完书之后运行它）。
//
//   python tools/book.py build                       # 书和练习页 → _build/html/，练习页在 _build/html/practice/
//   npm ci --prefix practice/web                     # 一次：playwright-core（tools/install.sh 会装），不下载浏览器
//   node tools/test_practice_web.mjs _build/html [--chromium /usr/bin/chromium] [--only ch06_page_table ...]
//                                                [--screenshots DIR]
//
// 脚本自己在 127.0.0.1 的随机端口上提供 _build/html，用 Debian 的 /usr/bin/chromium（playwright-core 的
// executablePath；全新的 user-data-dir）打开练习页，然后像读者一样操作，结果只从页面自己的结果区读：
//   - 每个 exercise.toml 里 browser = true 的练习都在页面里；原样的 stub 运行后是"失败"，
//     把 practice/<练习>/solution.py 填进代码框运行后是"全部通过"（失败时这一行以 FAIL 开头，写着练习名）。
//     第一道题整页打开，之后像读者一样在页面里换题（"全部练习"→ 点列表里的题），Python 只加载一次（worker 只开一个）；
//     "← 上一题"和浏览器后退也在页面里换题；换题后上一次运行留在 /ex 的文件和导入的模块都不在了；
//   - 不带 ?ex= 打开是练习列表（在首屏，没有空的编辑器），每题显示章和上次结果；刷新后代码和结果还在；
//     "恢复初始代码"；语法错误 → 收集失败；死循环 → 超时、worker 重启、之后还能运行；运行中换题 → 停掉、重启；
//   - 书里每个 practice/index.html?ex=… 链接都指向存在的练习，练习页回到书和回到章的链接都能打开。
// 退出码：0 全部通过，1 有失败，2 用法错误或环境不全（没有 chromium / playwright-core / 构建好的练习页）。
import { createRequire } from "node:module";
import fs from "node:fs";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const ROOT = path.resolve(here, "..");
const PRACTICE = path.join(ROOT, "practice");

// 参数：一个位置参数（书的 HTML 目录）和 --chromium PATH、--screenshots DIR、--only NAME（可以重复）
const opts = { "--chromium": [], "--screenshots": [], "--only": [] };
const positional = [];
for (let i = 2; i < process.argv.length; i++) {
  const a = process.argv[i];
  if (a in opts && i + 1 < process.argv.length) opts[a].push(process.argv[++i]);
  else if (a.startsWith("--")) { console.log(`test_practice_web: 不认识的参数 ${a}`); process.exit(2); }
  else positional.push(a);
}
const site = path.resolve(positional[0] ?? path.join(ROOT, "_build", "html"));
const exe = opts["--chromium"].at(-1) ?? process.env.CHROMIUM ?? "/usr/bin/chromium";
const shots = opts["--screenshots"].at(-1) ?? null;
const only = opts["--only"];
const LOAD_MS = 180000;  // 一次 Pyodide 加载最多等这么久（2 个核的 CI 机器上实测十几秒）

function die(msg) {
  console.log(`test_practice_web: ${msg}`);
  process.exit(2);
}
if (!fs.existsSync(path.join(site, "practice", "exercises.json"))) die(`${site}/practice/exercises.json 不存在：先 python tools/book.py build`);
if (!fs.existsSync(exe)) die(`没有 ${exe}（Debian 的 chromium：bash tools/install.sh 会装）`);
let chromium;
try {
  const require = createRequire(path.join(PRACTICE, "web", "package.json"));
  ({ chromium } = require("playwright-core"));
} catch {
  die("没有 playwright-core：npm ci --prefix practice/web（bash tools/install.sh 会装）");
}

// ---- 仓库里的浏览器练习（和页面比对；参考答案只从这里读，从不发布到网站上）
const repoExercises = fs.readdirSync(PRACTICE).sort()
  .filter((d) => /^ch\d\d_[a-z0-9_]+$/.test(d) && fs.existsSync(path.join(PRACTICE, d, "exercise.toml")))
  .filter((d) => /^\s*browser\s*=\s*true\b/m.test(fs.readFileSync(path.join(PRACTICE, d, "exercise.toml"), "utf8")));
const read = (name, file) => fs.readFileSync(path.join(PRACTICE, name, file), "utf8");

// ---- 静态文件服务：只在 127.0.0.1，随机端口
const TYPES = { ".html": "text/html; charset=utf-8", ".js": "text/javascript", ".mjs": "text/javascript", ".json": "application/json",
  ".wasm": "application/wasm", ".css": "text/css", ".svg": "image/svg+xml", ".png": "image/png", ".zip": "application/zip",
  ".whl": "application/zip", ".woff2": "font/woff2", ".txt": "text/plain; charset=utf-8" };
const server = http.createServer((req, res) => {
  let p = decodeURIComponent(new URL(req.url, "http://x").pathname);
  let file = path.join(site, p);
  if (!file.startsWith(site)) { res.writeHead(403).end(); return; }
  if (fs.existsSync(file) && fs.statSync(file).isDirectory()) file = path.join(file, "index.html");
  fs.readFile(file, (err, body) => {
    if (err) { res.writeHead(404).end("not found"); return; }
    res.writeHead(200, { "content-type": TYPES[path.extname(file)] ?? "application/octet-stream" }).end(body);
  });
});
await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
const origin = `http://127.0.0.1:${server.address().port}`;
const base = `${origin}/practice/`;

// ---- 检查和报告
let failures = 0, passes = 0;
const check = (cond, what) => {
  console.log(`${cond ? "ok  " : "FAIL"} ${what}`);
  if (cond) passes++; else failures++;
  return cond;
};

const profile = fs.mkdtempSync(path.join(os.tmpdir(), "practice-chromium-"));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: exe,
  headless: true,
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"],
  viewport: { width: 1280, height: 860 },
});
const page = context.pages()[0] ?? await context.newPage();
const consoleErrors = [];
const watch = (p) => {
  p.on("console", (m) => { if (m.type() === "error") consoleErrors.push(m.text()); });
  p.on("pageerror", (e) => consoleErrors.push(String(e)));
};
watch(page);
page.on("dialog", (d) => d.accept());  // "恢复初始代码"的确认框
let workers = 0;  // 页面开过几个 Web Worker（每个都要加载一遍 Python）
page.on("worker", () => workers++);

const DONE = ["passed", "failed", "timeout", "load-error"];
const waitReady = () => page.waitForFunction(() => ["ready", "load-error"].includes(document.body.dataset.status), null, { timeout: LOAD_MS });
const waitDone = (ms = 120000) => page.waitForFunction((d) => d.includes(document.body.dataset.status), DONE, { timeout: ms });
const state = () => page.evaluate(() => ({
  status: document.body.dataset.status,
  passed: document.body.dataset.passed ?? "0/0",
  summary: document.getElementById("summary").textContent,
  statusLine: document.getElementById("status").textContent,
  last: document.getElementById("last").textContent,
  code: document.getElementById("code").value,
}));
const counts = (s) => s.passed.split("/").map(Number);
async function runCode(code) {
  if (code !== null) await page.fill("#code", code);
  await page.click("#run");
  await waitDone();
  return state();
}
// 整页打开一道题；python = false 时不等 Python 加载好（只看代码框和上次结果）
async function openExercise(name, query = "", python = true) {
  await page.goto(`${base}?ex=${name}${query}`);
  if (python) await waitReady();
  else await page.waitForFunction(() => !document.getElementById("exercise").hidden);  // 题目和代码框已经填好
  return state();
}
// 像读者一样在页面里换题："全部练习"→ 列表里点这道题（不重新载入页面，Python 不重新加载）
async function switchExercise(name) {
  await page.click("#crumbs a[href='./']");
  await page.waitForFunction(() => document.body.dataset.status === "list");
  await page.click(`#listview tr[data-ex="${name}"] a`);
  await waitReady();
  return state();
}
const listState = () => page.$$eval("#listview tr[data-ex]", (rows) => rows.map((r) => ({
  name: r.dataset.ex, state: r.querySelector(".state").className.replace("state ", ""), text: r.querySelector(".state").textContent })));
const httpOk = async (url) => (await fetch(url)).ok;

try {
  // 0. 书的每一页离线可读：不向 127.0.0.1 以外发任何请求，公式由书里自带的 MathJax 排好，代码清单不折行（横向滚动），图不扁
  const pages = ["book/performance.html", ...fs.readdirSync(path.join(site, "book", "chapters"))
    .filter((f) => f.endsWith(".html")).sort().map((f) => `book/chapters/${f}`)];
  // 三个标签页同时读（大部分时间在等网络空闲），结果按页面的顺序报告
  const tabs = [page, ...await Promise.all([1, 2].map(() => context.newPage()))];
  tabs.slice(1).forEach(watch);
  const queue = [...pages], results = new Map();
  await Promise.all(tabs.map(async (tab) => {
    const outside = [];
    await tab.route((url) => !url.toString().startsWith(origin), (route) => { outside.push(route.request().url()); route.abort(); });
    for (let rel; (rel = queue.shift()) !== undefined;) {
      outside.length = 0;
      await tab.goto(`${origin}/${rel}`, { waitUntil: "networkidle" });
      const math = await tab.$$eval(".math", (e) => e.length);
      if (math) await tab.waitForFunction((n) => document.querySelectorAll("mjx-container").length >= n, math, { timeout: 30000 })
        .catch(() => {});
      const rendered = await tab.$$eval("mjx-container", (e) => e.length);
      const wraps = await tab.$$eval("div.cell_input div.highlight pre", (e) => e.filter((x) => getComputedStyle(x).whiteSpace !== "pre").length);
      // 单元格画的图在正文栏里至少 250 px 高：再矮，坐标轴上的字就读不出来了
      const flat = await tab.$$eval("div.cell_output img", (e) => e.filter((i) => i.getBoundingClientRect().height < 250).length);
      results.set(rel, [outside.length === 0 && rendered >= math && wraps === 0 && flat === 0,
        `${rel}：离线（对外请求 ${outside.length}${outside.length ? "：" + outside.slice(0, 3).join(" ") : ""}），公式 ${rendered}/${math} 排好，` +
        `折行的代码清单 ${wraps}，矮于 250 px 的图 ${flat}`]);
    }
    await tab.unrouteAll();
  }));
  for (const rel of pages) check(...results.get(rel));
  await Promise.all(tabs.slice(1).map((t) => t.close()));

  const manifest = await (await fetch(`${base}exercises.json`)).json();
  const names = manifest.exercises.map((e) => e.name);
  check(JSON.stringify([...names].sort()) === JSON.stringify(repoExercises),
    `练习页里的练习 = 仓库里 browser = true 的练习（${repoExercises.length} 道）` +
    (JSON.stringify([...names].sort()) === JSON.stringify(repoExercises) ? "" : `：页面 ${names.join(",")}；仓库 ${repoExercises.join(",")}`));
  for (const name of only) check(names.includes(name), `--only ${name}：练习页上有这道题`);
  for (const name of names) check(!("solution" in manifest.exercises.find((e) => e.name === name)), `${name}：网站上没有参考答案`);

  // 1. 不带 ?ex=：练习列表在首屏，没有空编辑器
  await page.goto(base);
  await page.waitForFunction(() => document.body.dataset.status === "list");
  const top = await page.$eval("#listview", (el) => el.getBoundingClientRect().top);
  const editorShown = await page.isVisible("#exercise");
  check(top < 200 && !editorShown, `不带 ?ex= 打开是练习列表（列表顶端在 ${Math.round(top)} px，编辑器${editorShown ? "也显示了" : "没有显示"}）`);
  let rows = await listState();
  check(rows.length === names.length && rows.every((r) => r.state === "none"), `列表列出 ${rows.length} 道题，都是"还没做"`);
  const chapterHeads = await page.$$eval("#listview h3", (hs) => hs.map((h) => h.textContent));
  check(chapterHeads.length > 0 && chapterHeads.every((h) => /^(第 \d+ 章|附录)/.test(h)), `列表按章分组：${chapterHeads.map((h) => h.split(" 回到本章")[0]).join(" | ")}`);
  const bookHref = await page.$eval("#book", (a) => a.href);
  check(await httpOk(bookHref), `"回到本书"能打开：${bookHref.replace(origin, "")}`);
  if (shots) { fs.mkdirSync(shots, { recursive: true }); await page.screenshot({ path: path.join(shots, "list-empty.png"), fullPage: true }); }

  // 2. 书里每个指向练习的链接都有对应的练习；练习页"回到本章"的链接都能打开、锚点存在
  const chapterDir = path.join(site, "book", "chapters");
  const linked = new Set();
  for (const f of fs.existsSync(chapterDir) ? fs.readdirSync(chapterDir).filter((f) => f.endsWith(".html")) : []) {
    for (const m of fs.readFileSync(path.join(chapterDir, f), "utf8").matchAll(/href="((?:\.\.\/)*practice\/index\.html\?ex=([A-Za-z0-9_]+))"/g)) {
      linked.add(m[2]);
      const target = new URL(m[1], `${origin}/book/chapters/${f}`).href;
      check(names.includes(m[2]) && target === `${base}index.html?ex=${m[2]}`, `${f} 的链接 ${m[1]} 指向练习页上的 ${m[2]}`);
    }
  }
  for (const e of manifest.exercises.filter((e) => e.chapter_url)) {
    const url = new URL(e.chapter_url, base);
    const body = await (await fetch(url)).text();
    check(!url.hash || body.includes(`id="${url.hash.slice(1)}"`), `${e.name}："回到本章"→ ${e.chapter_url}`);
  }
  const unlinked = names.filter((n) => !linked.has(n));
  if (unlinked.length) console.log(`note 书里还没有链接到：${unlinked.join(", ")}`);

  // 3. 每一道题：原样的 stub 失败，参考答案全部通过。第一道整页打开，之后在页面里换题，Python 只加载一次
  const todo = names.filter((n) => !only.length || only.includes(n));
  let first = true;
  for (const name of todo) {
    const t0 = Date.now();
    let s;
    if (first) {
      workers = 0;
      await page.goto(`${base}?ex=${name}`);
      const shown = await page.waitForSelector("#loading", { state: "visible", timeout: 10000 }).then(() => true, () => false);
      check(shown, "加载 Python 时显示进度条");  // 第一次加载 Python 时有进度条
      await waitReady();
      await page.evaluate(() => { window.sameDocument = true; });
      s = await state();
    } else {
      s = await switchExercise(name);
    }
    const loadS = ((Date.now() - t0) / 1000).toFixed(1);
    if (!check(s.status === "ready", `${name}：Python 就绪（${loadS} 秒）${s.status === "ready" ? "" : "：" + s.statusLine}`)) continue;
    if (first && shots) await page.screenshot({ path: path.join(shots, "exercise-ready.png") });
    check(s.code === read(name, "stub.py") && s.summary === "" && s.passed === "0/0", `${name}：代码框里是 stub，没有上一题的结果`);
    s = await runCode(null);
    let [p, total] = counts(s);
    check(s.status === "failed" && total > 0, `${name} 原样的 stub 失败：${s.summary}`);
    s = await runCode(read(name, "solution.py"));
    [p, total] = counts(s);
    check(s.status === "passed" && p === total && total > 0, `${name} 参考答案全部通过：${s.summary}（${s.statusLine}）`);
    if (first && shots) await page.screenshot({ path: path.join(shots, "exercise-passed.png") });
    first = false;
  }
  // "← 上一题"和浏览器的后退也都在页面里换题
  const last = todo.at(-1), prev = names[names.indexOf(last) - 1];
  if (prev) {
    await page.click("#crumbs a:has-text('上一题')");
    await waitReady();
    let s = await state();
    check(new URL(page.url()).search === `?ex=${prev}` && s.code === read(prev, todo.includes(prev) ? "solution.py" : "stub.py"),
      `"← 上一题"：${last} → ${prev}，代码框里是那道题的代码`);
    await page.goBack();
    await page.waitForFunction((n) => location.search === `?ex=${n}` && document.body.dataset.status === "ready", last);
    s = await state();
    check(s.code === read(last, "solution.py") && s.last.includes("通过"), `浏览器后退：回到 ${last}，代码和上次结果都在`);
  }
  check(await page.evaluate(() => window.sameDocument === true) && workers === 1,
    `${todo.length} 道题都在同一个页面里做完，只开了 ${workers} 个 Python worker`);

  // 3b. 换题后上一次运行留下的东西都不在了：在一道题里留下文件、目录和导入过的模块，换到另一道题（只有一道时就是它自己）
  // 检查：代码 import 时 /ex 里只有这次的三个文件，sys.modules 里没有从 /ex 导入的其它模块；不干净就"收集失败"
  const [pa, pb] = [todo.at(-1), todo[0]];
  let s = await runCode(read(pa, "stub.py") + `
import os, sys
os.makedirs("/ex/leftover_dir", exist_ok=True)
with open("/ex/leftover.py", "w") as f:
    f.write("X = 1")
sys.path.insert(0, "/ex")
import importlib; importlib.invalidate_caches()
import leftover
`);
  check(s.status === "failed" && !s.summary.includes("收集失败"), `${pa}：留下 /ex/leftover.py、/ex/leftover_dir 和模块 leftover（${s.summary}）`);
  s = await switchExercise(pb);
  s = await runCode(read(pb, "stub.py") + `
import os, sys
_left = sorted(n for n, m in list(sys.modules.items())
               if str(getattr(m, "__file__", None) or "").startswith("/ex/") and n not in ("solution", "test_exercise"))
assert not _left and sorted(os.listdir("/ex")) == ["pytest.ini", "solution.py", "test_exercise.py"], (_left, os.listdir("/ex"))
`);
  let [, probeTotal] = counts(s);
  check(s.status === "failed" && !s.summary.includes("收集失败") && probeTotal > 0, `${pb}：换题后从干净的 /ex 开始（${s.summary}）`);
  for (const name of new Set([pb, pa])) {  // 恢复成参考答案，后面的检查要用
    if (name !== pb) s = await switchExercise(name);
    s = await runCode(read(name, "solution.py"));
    check(s.status === "passed", `${name}：换回参考答案仍全部通过：${s.summary}`);
  }

  // 4. 语法错误 → 收集失败；改对后同一个 worker 再跑
  const one = only[0] ?? names[0];
  s = await switchExercise(one);
  s = await runCode("def broken(:\n");
  check(s.status === "failed" && s.summary.includes("收集失败"), `${one} 语法错误：${s.summary}`);
  s = await runCode(read(one, "solution.py"));
  check(s.status === "passed", `${one} 改对后重跑：${s.summary}`);

  // 5. 死循环 → 超时（?timeout=3，运行时按当前地址读，所以不用重新载入），worker 被杀掉重启，页面还能用
  await page.evaluate(() => history.replaceState(null, "", location.search + "&timeout=3"));
  s = await runCode("while True:\n    pass\n");
  check(s.status === "timeout" && s.summary.includes("超时"), `${one} 死循环：${s.summary}`);
  await page.waitForFunction(() => !document.getElementById("run").disabled, null, { timeout: LOAD_MS });
  s = await runCode(read(one, "solution.py"));
  check(s.status === "passed", `${one} 超时后重启的 Python 正常：${s.summary}`);

  // 6. 运行中换题：这次运行被停掉、不记结果，worker 重启，回来还能运行
  const before = workers;
  await page.fill("#code", "while True:\n    pass\n");
  await page.click("#run");
  await page.waitForFunction(() => document.body.dataset.status === "running");
  s = await switchExercise(one);
  check(s.status === "ready" && s.summary === "" && s.last.includes("通过") && workers === before + 1,
    `${one} 运行中换题：停掉并重启 Python（worker ${before} → ${workers}），上次结果仍是"${s.last}"`);
  s = await runCode(read(one, "solution.py"));
  check(s.status === "passed", `${one} 换题重启后正常：${s.summary}`);

  // 7. 刷新之后代码和结果还在；列表显示结果；恢复初始代码（这些不用等 Python）
  s = await openExercise(one, "", false);
  check(s.code === read(one, "solution.py") && s.last.includes("通过"), `${one}：刷新后代码还在，显示上次结果（${s.last}）`);
  await page.goto(base);
  await page.waitForFunction(() => document.body.dataset.status === "list");
  rows = await listState();
  const done = rows.filter((r) => only.length ? only.includes(r.name) : true);
  check(done.every((r) => r.state === "passed"), `列表里做过的题都是"通过"：${done.map((r) => `${r.name} ${r.text}`).join("；")}`);
  if (shots) await page.screenshot({ path: path.join(shots, "list-done.png"), fullPage: true });
  s = await openExercise(one, "", false);
  await page.click("#reset");
  s = await state();
  check(s.code === read(one, "stub.py"), `${one}：恢复初始代码`);
  s = await openExercise(one, "", false);
  check(s.code === read(one, "stub.py"), `${one}：恢复后刷新仍是 stub`);

  // 8. 不存在的练习 → 提示 + 列表
  await page.goto(`${base}?ex=no_such_exercise`);
  await page.waitForFunction(() => document.body.dataset.status === "list");
  check(await page.isVisible("#notice"), "?ex=不存在的练习：提示并显示列表");

  check(consoleErrors.length === 0, `浏览器控制台没有错误${consoleErrors.length ? "：" + consoleErrors.join(" | ") : ""}`);
} catch (err) {
  check(false, `测试中断：${err.stack || err}`);
} finally {
  await context.close();
  server.close();
  fs.rmSync(profile, { recursive: true, force: true });
}
console.log(`练习页（无头 Chromium）：${passes} 项通过，${failures} 项失败`);
process.exit(failures ? 1 : 0);
