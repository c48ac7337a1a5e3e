#!/usr/bin/env python3
"""Walk the README's own path, as a newcomer would (CI runs this: .ci/run).

    python3 tools/readme_path.py            print the commands it reads from README.md
    python3 tools/readme_path.py --run      run them on this checkout

The commands are read from the README's "两条命令" block, not copied here, so what the README tells a newcomer
is exactly what CI proves: the virtual environment in the checkout (`.venv`), then command 1 (install, then
`python -m minisgl` on the embedded model), then command 2 (the whole test suite). Command 1 serves forever, so
this runs it in the background until its ready line, runs the `openai` command that line prints (one question
through the official client), checks the answer is not empty, and stops the server with Ctrl-C (SIGINT): it
must exit within a few seconds and leave no worker process behind. Only then does command 2 run.
Needs only the standard library (it runs before the virtual environment exists).
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List

ROOT = Path(__file__).resolve().parent.parent
READY_TIMEOUT = 900  # s: command 1 installs first (minutes on a fresh machine), then loads the model


def readme_commands(text: str) -> List[str]:
    """The command lines of the first ```bash block after the heading "## 两条命令" (comments dropped)."""
    m = re.search(r"^## 两条命令\n.*?```bash\n(.*?)```", text, re.DOTALL | re.MULTILINE)
    if not m:
        raise SystemExit("README.md: no ```bash block under '## 两条命令'")
    lines = [line.strip() for line in m.group(1).splitlines()]
    cmds = [line for line in lines if line and not line.startswith("#")]
    if len(cmds) != 3 or "venv" not in cmds[0] or "python -m minisgl" not in cmds[1] or "test_all" not in cmds[2]:
        raise SystemExit(f"README.md: expected three commands (the venv, command 1 ending in `python -m minisgl`, "
                         f"command 2 running tools/test_all.sh), found {cmds}")
    return cmds


def section(title: str) -> None:
    print(f"\n=== {title} ({time.strftime('%H:%M:%S')})", flush=True)


def serve_and_ask(venv: str, cmd1: str) -> None:
    """Command 1 in the background; at its ready line, run the openai command it prints; then Ctrl-C."""
    log = ROOT / ".build" / "readme_server.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        server = subprocess.Popen(["bash", "-c", f"{venv} && {cmd1}"], cwd=ROOT, stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    try:
        ask = _wait_ready(server, log)
        print(f"$ {ask}", flush=True)
        t0 = time.monotonic()
        answer = subprocess.run(["bash", "-c", f"{venv} && {ask}"], cwd=ROOT, capture_output=True, text=True,
                                timeout=120)
        if answer.returncode or not answer.stdout.strip():
            raise SystemExit(f"the openai command failed (exit {answer.returncode}):\n{answer.stdout}{answer.stderr}")
        print(f"{answer.stdout.strip()}\n(answered in {time.monotonic() - t0:.1f} s)", flush=True)
    finally:
        _stop(server, log)


def _wait_ready(server: subprocess.Popen, log: Path) -> str:
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        if "minisgl is ready at" in text:
            cmds = [line.strip() for line in text.splitlines() if line.strip().startswith("python -c \"from openai")]
            if cmds:
                return cmds[0]
        if server.poll() is not None:
            raise SystemExit(f"command 1 exited with code {server.returncode} before it was ready:\n{text[-4000:]}")
        time.sleep(1)
    raise SystemExit(f"command 1 was not ready within {READY_TIMEOUT} s:\n{log.read_text(errors='replace')[-4000:]}")


def _stop(server: subprocess.Popen, log: Path) -> None:
    """Ctrl-C, as a user stops it: the whole process group gets SIGINT; the launcher must exit within 20 s and its
    workers 10 s later."""
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGINT)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            raise SystemExit(f"python -m minisgl did not exit within 20 s of Ctrl-C:\n"
                             f"{log.read_text(errors='replace')[-4000:]}")
    deadline = time.monotonic() + 10  # the launcher is gone; its workers get 10 s more to exit
    while (left := _group(server.pid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    if left:
        os.killpg(server.pid, signal.SIGKILL)
        raise SystemExit(f"processes left behind after Ctrl-C: {left}")
    print(f"server stopped with Ctrl-C (exit {server.returncode}), no process left; its log: "
          f"{log.relative_to(ROOT)}", flush=True)


def _group(pgid: int) -> List[str]:
    """Processes still in the process group (ps, not pgrep: pgrep -g is missing on some systems)."""
    out = subprocess.run(["ps", "-e", "-o", "pid=,pgid=,stat=,args="], capture_output=True, text=True).stdout
    return [line.strip() for line in out.splitlines()
            if line.split()[1:2] == [str(pgid)] and not line.split()[2].startswith("Z")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", action="store_true", help="run the commands (default: print them)")
    args = ap.parse_args()
    venv, cmd1, cmd2 = readme_commands((ROOT / "README.md").read_text(encoding="utf-8"))
    if not args.run:
        print("\n".join([venv, cmd1, cmd2]))
        return 0
    section(f"README: the virtual environment, then command 1: {cmd1}")
    serve_and_ask(venv, cmd1)
    section(f"README: command 2: {cmd2}")
    return subprocess.run(["bash", "-c", f"{venv} && {cmd2}"], cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main())
