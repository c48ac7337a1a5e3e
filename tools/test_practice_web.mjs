// 用无头 Chromium 测浏览器练习页（practice/web/）。
//
//   python tools/build_practice_web.py /tmp/pw --with-solutions
//   python -m http.server -b 127.0.0.1 8765 -d /tmp/pw &
//   npm install --prefix practice/.cache/node playwright-core      # 一次；practice/.cache/ 被 git 忽略
//   node tools/test_practice_web.mjs http://127.0.0.1:8765/ [--chromium /usr/bin/chromium] [--slow]
//
// 对每个练习：参考答案必须全过，原样的 stub 必须 0 通过；第一个练习再测语法错误（收集失败）；
// --slow 再测死循环（30 秒超时后 worker 被杀掉、重新加载，之后还能正常运行）。
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(path.join(here, "..", "practice", ".cache", "node", "node_modules", "x.js"));
const { chromium } = require("playwright-core");

const args = process.argv.slice(2);
const base = args.find((a) => a.startsWith("http")) ?? "http://127.0.0.1:8765/";
const exe = args.includes("--chromium") ? args[args.indexOf("--chromium") + 1] : "/usr/bin/chromium";
const slow = args.includes("--slow");

const browser = await chromium.launch({
  executablePath: exe,
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--disable-background-networking"],
});
const page = await browser.newPage();
const consoleErrors = [];
page.on("console", (m) => { if (m.type() === "error") consoleErrors.push(m.text()); });
page.on("pageerror", (e) => consoleErrors.push(String(e)));

const manifest = await (await fetch(new URL("exercises.json", base))).json();
let failures = 0;
const check = (cond, what) => {
  console.log(`${cond ? "ok  " : "FAIL"} ${what}`);
  if (!cond) failures++;
};
const done = '["passed","failed","timeout","load-error"]';
const waitDone = (ms = 120000) =>
  page.waitForFunction(`${done}.includes(document.body.dataset.status)`, null, { timeout: ms });
const state = () => page.evaluate(() => ({
  status: document.body.dataset.status,
  passed: document.body.dataset.passed,
  summary: document.getElementById("summary").textContent,
  statusLine: document.getElementById("status").textContent,
}));

// 练习列表
await page.goto(base);
await page.waitForFunction(`document.body.dataset.status === "list"`);
const links = await page.$$eval("#list a", (as) => as.map((a) => a.textContent));
check(links.length === manifest.exercises.length, `列表页列出 ${links.length} 个练习`);

for (const ex of manifest.exercises) {
  for (const fill of ex.solution ? ["solution", "stub"] : ["stub"]) {
    const t0 = Date.now();
    await page.goto(`${base}?ex=${ex.name}&fill=${fill}&autorun=1`);
    await waitDone();
    const s = await state();
    const [p, total] = (s.passed ?? "0/0").split("/").map(Number);
    const secs = ((Date.now() - t0) / 1000).toFixed(1);
    if (fill === "solution") check(s.status === "passed" && p === total && total > 0, `${ex.name} 参考答案：${s.summary}（${secs} 秒；${s.statusLine}）`);
    else check(s.status === "failed" && p === 0 && total > 0, `${ex.name} 原样的 stub：${s.summary}（${secs} 秒）`);
  }
}

// 语法错误 → 收集失败；之后改对了还能再跑
const first = manifest.exercises[0];
await page.goto(`${base}?ex=${first.name}&fill=stub`);
await page.waitForFunction(`document.body.dataset.status === "ready"`, null, { timeout: 120000 });
await page.fill("#code", "def broken(:\n");
await page.click("#run");
await waitDone();
let s = await state();
check(s.status === "failed" && s.summary.includes("收集失败"), `${first.name} 语法错误：${s.summary}`);
if (first.solution) {
  await page.fill("#code", first.solution);
  await page.click("#run");
  await page.waitForFunction(`document.body.dataset.status !== "running"`);
  await waitDone();
  s = await state();
  check(s.status === "passed", `${first.name} 同一个 worker 里改对后重跑：${s.summary}`);
}

if (slow) {
  await page.fill("#code", "while True:\n    pass\n");
  await page.click("#run");
  await waitDone(60000);
  s = await state();
  check(s.status === "timeout", `死循环：${s.summary}`);
  await page.waitForFunction(`document.body.dataset.status === "ready"`, null, { timeout: 120000 });
  if (first.solution) {
    await page.fill("#code", first.solution);
    await page.click("#run");
    await waitDone();
    s = await state();
    check(s.status === "passed", `超时后重新加载的 worker 正常：${s.summary}`);
  }
}

check(consoleErrors.length === 0, `浏览器控制台没有错误${consoleErrors.length ? "：" + consoleErrors.join(" | ") : ""}`);
await browser.close();
console.log(failures ? `${failures} 项失败` : "全部通过");
process.exit(failures ? 1 : 0);
