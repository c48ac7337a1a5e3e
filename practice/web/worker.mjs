// 在 Web Worker 里跑 Pyodide + pytest：死循环时页面可以 terminate() 这个 worker 再重新开一个。
// 页面换题时不换 worker：每次运行都从干净的 /ex 开始，并忘掉之前从 /ex 导入的模块（不管是哪道题的）。
import { loadPyodide } from "./pyodide/pyodide.mjs";

let py = null;
let runTests = null;

// 加载分几步，每步告诉页面一声（页面显示进度条）：Python 运行时、每个 wheel、测试环境
const progress = (step, total, text) => self.postMessage({ type: "progress", step, total, text });

async function init(wheels) {
  const total = wheels.length + 2;
  progress(0, total, "下载并启动 Python 运行时（Pyodide，约 14 MB，之后浏览器会缓存）");
  // wheel 和运行时同时下载
  const downloads = wheels.map(async (w) => {
    const resp = await fetch(new URL(`./wheels/${w}`, import.meta.url));
    if (!resp.ok) throw new Error(`下载 ${w} 失败：HTTP ${resp.status}`);
    return resp.arrayBuffer();
  });
  downloads.forEach((d) => d.catch(() => {}));  // 错误在下面 await 时再报
  py = await loadPyodide({ indexURL: new URL("./pyodide/", import.meta.url).href });
  const purelib = py.runPython("import sysconfig; sysconfig.get_paths()['purelib']");
  for (const [i, w] of wheels.entries()) {
    progress(1 + i, total, `安装 ${w.split("-")[0]}（${i + 1}/${wheels.length}）`);
    // PyPI 的 wheel 与 pyodide-lock.json 的 sha256 不同，所以不用 loadPackage，直接解压到 site-packages
    py.unpackArchive(await downloads[i], "wheel", { extractDir: purelib });
  }
  progress(total - 1, total, "准备 pytest");
  py.runPython(`
import importlib, io, json, linecache, os, shutil, sys, contextlib, warnings, xml.etree.ElementTree as ET
sys.dont_write_bytecode = True
os.makedirs("/ex", exist_ok=True)

def run_tests(module, code, tests):
    import pytest
    # 每次运行从干净的状态开始：空的 /ex；之前从 /ex 导入的模块（也许是另一道题的）全部忘掉
    os.chdir("/")
    shutil.rmtree("/ex", ignore_errors=True)
    os.makedirs("/ex")
    for name, m in list(sys.modules.items()):
        if name in (module, "test_exercise") or str(getattr(m, "__file__", None) or "").startswith("/ex/"):
            del sys.modules[name]
    linecache.clearcache()
    with open(f"/ex/{module}.py", "w", encoding="utf-8") as f:
        f.write(code)
    with open("/ex/test_exercise.py", "w", encoding="utf-8") as f:
        f.write(tests)
    with open("/ex/pytest.ini", "w") as f:
        f.write("[pytest]\\n")
    importlib.invalidate_caches()
    os.chdir("/ex")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        rc = pytest.main(["test_exercise.py", "-q", "-p", "no:cacheprovider", "-c", "/ex/pytest.ini",
                          "--rootdir", "/ex", "--junitxml=/ex/report.xml", "-o", "junit_family=xunit1",
                          "--color=no"])
    cases = []
    if os.path.exists("/ex/report.xml"):
        for case in ET.parse("/ex/report.xml").getroot().iter("testcase"):
            name, outcome, reason = case.get("name", "?"), "passed", ""
            if not case.get("classname") and name == "test_exercise":
                name = "<收集失败>"
            for child in case:
                if child.tag in ("failure", "error", "skipped"):
                    outcome = {"failure": "failed"}.get(child.tag, child.tag)
                    lines = [l.strip() for l in (child.text or "").splitlines() if l.strip()]
                    e_lines = [l[1:].strip() for l in lines if l.startswith("E ") and "Error" in l]
                    msg = child.get("message") or ""
                    if e_lines and (not msg or msg == "collection failure"):
                        msg = e_lines[0]
                    reason = (msg or (lines[-1] if lines else "")).splitlines()[0][:300] if (msg or lines) else ""
                    break
            cases.append({"name": name, "outcome": outcome, "reason": reason})
    for case in cases:  # 语法错误：pytest 的摘要里没有行号，自己编译一次说出第几行
        if case["name"] == "<收集失败>":
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    compile(code, f"{module}.py", "exec", dont_inherit=True)
            except SyntaxError as exc:
                case["reason"] = f"第 {exc.lineno} 行：{type(exc).__name__}: {exc.msg}"
            except Exception:
                pass
    return json.dumps({"rc": int(rc), "output": out.getvalue(), "cases": cases})
`);
  runTests = py.globals.get("run_tests");
  py.runPython("import pytest");  // 第一次 import pytest 要一两秒：算在加载里，不算在第一次运行里
}

self.onmessage = async (ev) => {
  const msg = ev.data;
  try {
    if (msg.type === "init") {
      const t0 = performance.now();
      await init(msg.wheels);
      self.postMessage({ type: "ready", seconds: (performance.now() - t0) / 1000, version: py.runPython("import platform; platform.python_version()"), pyodide: py.version });
    } else if (msg.type === "run") {
      const t0 = performance.now();
      const res = JSON.parse(runTests(msg.module, msg.code, msg.tests));
      res.seconds = (performance.now() - t0) / 1000;
      self.postMessage({ type: "result", id: msg.id, ...res });
    }
  } catch (err) {
    self.postMessage({ type: "error", id: msg.id, message: String(err && err.message ? err.message : err) });
  }
};
