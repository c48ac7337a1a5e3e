"""judge.py 给每次 pytest 加载的插件：用 pytest 自己的报告钩子，每个测试（和收集失败）写一行 JSON 到 $JUDGE_REPORT；
每个测试开始时也写一行（outcome 是 started）。"""
import json
import os


def _write(name: str, outcome: str, reason: str, text: str) -> None:
    with open(os.environ["JUDGE_REPORT"], "a", encoding="utf-8") as f:
        f.write(json.dumps({"name": name, "outcome": outcome, "reason": reason, "text": text}, ensure_ascii=False) + "\n")


def _reason(report) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return crash.message
    if isinstance(report.longrepr, tuple):  # 跳过：(文件, 行号, 原因)
        return str(report.longrepr[2])
    return ""


def pytest_runtest_logstart(nodeid, location) -> None:  # 开始跑一个测试：超时时 judge.py 由此知道卡在哪个
    _write(nodeid.split("::")[-1], "started", "", "")


def pytest_collectreport(report) -> None:
    if report.failed:
        _write("<collection>", "error", _reason(report), report.longreprtext)


def pytest_runtest_logreport(report) -> None:
    name = report.nodeid.split("::")[-1]
    if report.when == "call":
        _write(name, report.outcome, _reason(report), report.longreprtext)
    elif report.when == "setup" and not report.passed:  # fixture 出错（error）或在 setup 里跳过（skipped）
        _write(name, "skipped" if report.skipped else "error", _reason(report), report.longreprtext)
    elif report.when == "teardown" and report.failed:  # 测试本身过了，收尾出错：也算没过
        _write(name, "error", _reason(report), report.longreprtext)
