#!/usr/bin/env python3
"""Data parallelism the SGLang way: N `python -m minisgl` replicas behind SGLang's own router (`sglang-router`).

    python tools/serve_dp.py N [--policy cache_aware|round_robin|random|power_of_two] [--host H] [--port P]
                               [--log-dir DIR] [minisgl flags ...]

Starts N replicas on free loopback ports (every flag this script does not know goes to each of them, e.g.
`--model`, `--num-pages`; each gets OMP_NUM_THREADS = the CPU cores / N unless you set it), waits for their /health, starts `python -m sglang_router.launch_router` in front
(`--worker-urls` the replicas, `--policy`), waits until the router has registered all N, and prints

    replica 0: http://127.0.0.1:41231  (OMP_NUM_THREADS=1; log: /tmp/.../replica0.log)
    ...
    router (cache_aware): http://127.0.0.1:30000

Point any OpenAI client at the router's /v1. Ctrl-C or SIGTERM stops the router and every replica (each
replica's own workers with it); a replica or the router that exits on its own stops everything too. The
router comes from the optional extra: `pip install -e ".[scale]"` (sglang-router, a binary wheel).
The appendix of the book (book/chapters/ch16_scale.ipynb) explains it; benchmarks/bench_router.py measures it.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Sequence

import httpx

STARTUP_TIMEOUT = 600.0  # 秒：和 minisgl 自己等工作进程的上限相同
POLICIES = ("cache_aware", "round_robin", "random", "power_of_two")


@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    url: str
    log: Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_port(host: str, port: int) -> None:
    """路由器的地址在起副本之前先试绑一下：被占的端口、不是本机的 --host 立刻是一行错误，而不是等副本加载完模型，
    再看路由器的一段 Rust panic 转成的 Python traceback。"""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                          flags=socket.AI_PASSIVE)[0]
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # 和路由器一样：不怕 TIME_WAIT
            s.bind(addr)
    except OSError as e:  # socket.gaierror 也是 OSError
        raise ValueError(f"--host {host} --port {port}: the router cannot listen there: {e.strerror}") from None


def _die_with_parent() -> None:
    """子进程里、exec 之前：本脚本被 SIGKILL 时（来不及收拾）内核给子进程发 SIGTERM（只有 Linux 有）。"""
    os.setsid()  # 自己一个进程组：收拾时整组一起结束
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _spawn(name: str, cmd: List[str], url: str, log: Path, env: Dict[str, str] | None = None) -> Child:
    out = log.open("w")
    try:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                preexec_fn=_die_with_parent, env=env)
    finally:
        out.close()  # 子进程有自己的一份
    return Child(name, proc, url, log)


def _tail(log: Path, n: int = 20) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def _wait(children: Sequence[Child], ready: Any, what: str, timeout: float) -> None:
    """等到每个 child 都 ready(child) 为真；有一个先退出了、或者超时，就带着它日志的最后几行报错。"""
    deadline = time.monotonic() + timeout
    pending = list(children)
    while pending:
        for c in list(pending):
            if c.proc.poll() is not None:
                raise RuntimeError(f"{c.name} exited with code {c.proc.returncode} before it was {what}; "
                                   f"the end of {c.log}:\n{_tail(c.log)}")
            try:
                if ready(c):
                    pending.remove(c)
            except httpx.HTTPError:
                pass
        if pending and time.monotonic() > deadline:
            raise RuntimeError(f"{pending[0].name} was not {what} within {timeout:.0f} s; see {pending[0].log}")
        time.sleep(0.3)


def default_threads(n: int) -> int | None:
    """每个副本的 CPU 线程数：没设 OMP_NUM_THREADS 时把核平分给 N 个副本（None：沿用环境里的设置）。

    PyTorch 的 CPU 算子默认每个进程开"核数"个线程；N 个副本各开这么多，线程数是核数的 N 倍，OpenMP 的线程
    在每个并行区的末尾互相等待，被操作系统轮流挂起时整批一起变慢（附录里测得慢好几倍）。"""
    if "OMP_NUM_THREADS" in os.environ:
        return None
    return max(1, (os.cpu_count() or 1) // n)


def start_replicas(n: int, flags: Sequence[str], log_dir: Path, threads: int | None = None,
                   timeout: float = STARTUP_TIMEOUT) -> List[Child]:
    """N 个 `python -m minisgl`，各自一个空闲端口（threads：每个副本的 OMP_NUM_THREADS）；一起启动，等它们的
    /health 都回 200。"""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads)) if threads else None
    children: List[Child] = []
    try:
        for i in range(n):
            port = free_port()
            children.append(_spawn(f"replica {i}", [sys.executable, "-m", "minisgl", "--host", "127.0.0.1",
                                                    "--port", str(port), *flags],
                                   f"http://127.0.0.1:{port}", log_dir / f"replica{i}.log", env))
        _wait(children, lambda c: httpx.get(f"{c.url}/health", timeout=2).status_code == 200, "healthy", timeout)
    except BaseException:
        stop(children)
        raise
    return children


def _registered(router: Child, n: int) -> bool:
    """路由器的 GET /workers 列出它已经登记（探测过 /health、/get_model_info、/get_server_info）的 worker。"""
    r = httpx.get(f"{router.url}/workers", timeout=2)
    return r.status_code == 200 and len(r.json().get("workers", [])) >= n


def start_router(urls: Sequence[str], policy: str, log_dir: Path, host: str = "127.0.0.1", port: int = 0,
                 extra: Sequence[str] = (), timeout: float = 60.0) -> Child:
    """sglang-router 在 urls 前面：等到它登记了全部 worker。port=0：找一个空闲端口。"""
    port = port or free_port()
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", *urls, "--policy", policy,
           "--host", host, "--port", str(port), "--prometheus-host", "127.0.0.1",
           "--prometheus-port", str(free_port()), "--worker-startup-check-interval", "1", "--log-level", "warn",
           *extra]
    router = _spawn(f"router ({policy})", cmd, f"http://{shown}:{port}", log_dir / f"router-{policy}.log")
    try:
        _wait([router], lambda c: _registered(c, len(urls)), "ready", timeout)
    except BaseException:
        stop([router])
        raise
    return router


def stop(children: Sequence[Child], grace: float = 10.0) -> None:
    """SIGTERM 给每个子进程本身（minisgl 的启动器收到它，让还在等的请求回 503，再收拾自己的工作进程；发给整个进程组
    的话，工作进程抢先死掉，请求收到的是"某个工作进程退出了"），grace 秒后还在的整组 SIGKILL。"""
    for c in children:
        if c.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                c.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for c in children:
        try:
            c.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):  # 组里可能还有别的进程（minisgl 的工作进程）
            os.killpg(c.proc.pid, signal.SIGKILL)
        c.proc.wait()


@contextlib.contextmanager
def fleet(n: int, flags: Sequence[str], policy: str = "cache_aware", log_dir: Path | None = None,
          threads: int | None = None, **router_kwargs: Any) -> Iterator[tuple[Child, List[Child]]]:
    """with fleet(2, ["--model", m]) as (router, replicas): ... —— 结束时（包括出错）全部停掉。"""
    with contextlib.ExitStack() as stack:
        if log_dir is None:
            log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="minisgl-dp-")))
        replicas = start_replicas(n, flags, log_dir, threads)
        stack.callback(stop, replicas)
        router = start_router([r.url for r in replicas], policy, log_dir, **router_kwargs)
        stack.callback(stop, [router])
        yield router, replicas


@contextlib.contextmanager
def running_router(urls: Sequence[str], policy: str, log_dir: Path | None = None, **kwargs: Any) -> Iterator[Child]:
    """with running_router(urls, "round_robin") as router: ... —— 在已有的副本前面临时再起一个路由器。"""
    with contextlib.ExitStack() as stack:
        if log_dir is None:
            log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="minisgl-router-")))
        router = start_router(urls, policy, log_dir, **kwargs)
        stack.callback(stop, [router])
        yield router


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM 和 Ctrl-C 走同一条路


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="serve_dp.py", allow_abbrev=False,
                                 description=__doc__.split("\n")[0],
                                 epilog="every other flag goes to each `python -m minisgl` replica")
    ap.add_argument("n", type=int, help="number of replicas (data-parallel size)")
    ap.add_argument("--policy", default="cache_aware", choices=POLICIES, help="the router's policy")
    ap.add_argument("--host", default="127.0.0.1", help="the router's address (the replicas stay on loopback)")
    ap.add_argument("--port", type=int, default=30000, help="the router's port (SGLang's default)")
    ap.add_argument("--log-dir", type=Path, default=None, help="logs of the replicas and the router "
                                                               "(default: a new temporary folder)")
    ap.add_argument("--threads-per-replica", type=int, default=None,
                    help="OMP_NUM_THREADS of each replica (default: the CPU cores split between the replicas, "
                         "unless OMP_NUM_THREADS is set)")
    args, flags = ap.parse_known_args(argv)
    if args.n < 1:
        ap.error(f"N={args.n} is invalid: it must be >= 1")
    for bad in ("--api-key", "--shell", "--shell-mode"):
        if bad in flags:
            ap.error(f"{bad} is not supported here: the router talks to the replicas without a key, in HTTP")
    try:
        import sglang_router  # noqa: F401
    except ImportError:
        print("serve_dp.py needs SGLang's router: pip install -e \".[scale]\" (or pip install sglang-router==0.3.2)",
              file=sys.stderr)
        return 1
    try:
        check_port(args.host, args.port)
    except ValueError as e:
        print(f"serve_dp.py: error: {e}", file=sys.stderr)  # 和 argparse 的错误一样：一行，退出码 2
        return 2
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="minisgl-dp-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, _interrupt)
    children: List[Child] = []
    try:
        threads = args.threads_per_replica or default_threads(args.n)
        replicas = start_replicas(args.n, flags, log_dir, threads)
        children += replicas
        shown = f"OMP_NUM_THREADS={threads or os.environ['OMP_NUM_THREADS']}"
        for i, r in enumerate(replicas):
            print(f"replica {i}: {r.url}  ({shown}; log: {r.log})", flush=True)
        # 不重试：一个副本退出时这里会停掉全部，重试只会把副本说清原因的 503 换成路由器自己的 500
        router = start_router([r.url for r in replicas], args.policy, log_dir, host=args.host, port=args.port,
                              extra=["--disable-retries"])
        children.append(router)
        print(f"router ({args.policy}): {router.url}  (log: {router.log})", flush=True)
        print(f"ready: OpenAI clients use {router.url}/v1 ; Ctrl-C stops the router and the replicas", flush=True)
        while True:
            time.sleep(0.5)
            dead = [c for c in children if c.proc.poll() is not None]
            if dead:
                print(f"{dead[0].name} exited with code {dead[0].proc.returncode}: stopping everything; "
                      f"the end of {dead[0].log}:\n{_tail(dead[0].log)}", file=sys.stderr, flush=True)
                return 1
    except RuntimeError as e:
        print(f"serve_dp.py: {e}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print("stopping the router and the replicas", flush=True)
        return 0
    finally:
        # 收尾时不再理会 Ctrl-C 和 SIGTERM（再按一次 Ctrl-C、GNU timeout 再转发一次）：不然 KeyboardInterrupt 落在
        # 等子进程的半路，一段 traceback、退出码 -2；stop 有期限，grace 秒后整组 SIGKILL
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stop(children[::-1])  # 先停路由器，再停副本


if __name__ == "__main__":
    sys.exit(main())
