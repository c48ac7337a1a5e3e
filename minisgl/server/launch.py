# Tangled from book/chapters/ch15_server.ipynb and ch16_scale.ipynb — edit the notebooks, not this file.
from __future__ import annotations

import asyncio
import logging
import multiprocessing as mp
import queue
import signal
import sys
import time
from dataclasses import replace
from typing import Any, List

import psutil

from minisgl.distributed import DistributedInfo
from minisgl.scheduler import Scheduler
from minisgl.utils import init_logger
from minisgl.utils.mp import ZmqPushQueue

from .api_server import FrontendManager, SchedulerStats, app, create_frontend
from .args import ServerArgs, parse_args

logger = init_logger(__name__)

STARTUP_TIMEOUT = 600.0  # 秒：加载大模型、录 CUDA Graph 都算在里面


class ServingScheduler(Scheduler):
    """服务里的调度器：第 14 章的 Scheduler，加上 rank 0 把 SchedulerStats 推给 API Server（/metrics 用）。"""

    STATS_INTERVAL = 0.25  # 秒：忙的时候最多这么频繁；空下来时立刻推一次（/metrics 回到 0）

    def __init__(self, config: ServerArgs) -> None:
        super().__init__(config)
        primary = config.tp_info.is_primary()
        self._stats_queue = ZmqPushQueue(config.zmq_frontend_addr, create=False) if primary else None
        self._stats_sent: SchedulerStats | None = None
        self._stats_time = 0.0
        self.push_stats()

    def stats(self) -> SchedulerStats:
        c = self.cache
        free, cached = len(c.free_pages), c.prefix_cache.size_info.total_size // c.page_size
        return SchedulerStats(running=len(self.running), waiting=len(self.prefill.pending),
                              pages_used=c.num_pages - free - cached, pages_cached=cached, pages_free=free,
                              cached_tokens=c.hit_tokens)

    def push_stats(self) -> None:
        if self._stats_queue is None:
            return
        stats = self.stats()
        if stats != self._stats_sent:
            self._stats_queue.put(stats)
            self._stats_sent, self._stats_time = stats, time.monotonic()

    def run_step(self) -> bool:
        busy = super().run_step()
        if not self.has_work or time.monotonic() - self._stats_time > self.STATS_INTERVAL:
            self.push_stats()
        return busy

    def shutdown(self) -> None:
        if self._stats_queue is not None:
            self._stats_queue.stop()
        super().shutdown()

def _run_scheduler(args: ServerArgs, ack_queue: mp.Queue | None) -> None:
    import torch

    with torch.inference_mode():
        scheduler = ServingScheduler(args)
        scheduler.sync_all_ranks()  # 所有 rank 都初始化完（包括 ZMQ 订阅）再开始
        if ack_queue is not None and args.tp_info.is_primary():
            ack_queue.put("Scheduler is ready")
    if args.silent_output:
        logging.disable(logging.INFO)
    scheduler.run_forever()  # 第 14 章：收消息、跑一步；Ctrl-C 或 ExitMsg 时清理退出


class WorkerError(RuntimeError):
    """一个工作进程没能就绪（或者就绪前就退出了）。"""

def start_backend(server_args: ServerArgs) -> List[mp.Process]:
    """启动所有后端进程：每个 TP rank 一个调度器进程，一个 detokenizer，若干 tokenizer。等它们都就绪。"""
    from minisgl.tokenizer import tokenize_worker

    ctx = mp.get_context("spawn")  # CUDA 不支持 fork 出来的子进程
    ack_queue = ctx.Queue()
    world_size = server_args.tp_info.size
    procs: List[Any] = []

    def start(name: str, target: Any, *args: Any, **kwargs: Any) -> None:
        p = ctx.Process(target=target, args=args, kwargs=kwargs, name=name, daemon=True)
        p.start()
        procs.append(p)

    for i in range(world_size):
        start(f"minisgl-TP{i}-scheduler", _run_scheduler,
              replace(server_args, tp_info=DistributedInfo(i, world_size)), ack_queue)
    n = server_args.num_tokenizer
    common = dict(tokenizer_path=str(server_args.model_path), backend_addr=server_args.zmq_backend_addr,
                  frontend_addr=server_args.zmq_frontend_addr, local_bs=1, ack_queue=ack_queue)
    start("minisgl-detokenizer", tokenize_worker, **common, addr=server_args.zmq_detokenizer_addr,
          create=True, tokenizer_id=n)
    for i in range(n):  # 单独的 tokenizer 把 stop 字符串和提示词长度告诉 detokenizer（第 13 章）
        start(f"minisgl-tokenizer-{i}", tokenize_worker, **common, addr=server_args.zmq_tokenizer_addr,
              create=False, tokenizer_id=i, detokenizer_addr=server_args.zmq_detokenizer_addr)
    deadline = time.monotonic() + STARTUP_TIMEOUT
    for _ in range(n + 2):  # rank 0 调度器 + n 个 tokenizer + 1 个 detokenizer
        while True:
            try:
                logger.info(ack_queue.get(timeout=0.5))
                break
            except queue.Empty:
                pass
            for p in procs:
                if p.exitcode is not None:
                    raise WorkerError(f"{p.name} exited with code {p.exitcode} before it was ready "
                                      f"(its error is in the log above)")
            if time.monotonic() > deadline:
                raise WorkerError(f"the workers were not ready within {STARTUP_TIMEOUT:.0f} s")
    return procs


def ready_message(args: ServerArgs) -> str:
    host = "127.0.0.1" if args.server_host in ("0.0.0.0", "::") else args.server_host
    url, model = f"http://{host}:{args.server_port}", args.served_model_name
    key = f" -H 'Authorization: Bearer {args.api_key}'" if args.api_key else ""
    body = '{"model": "%s", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 32}' % model
    return (f"minisgl is ready at {url} (model {model})\n"
            f"  curl {url}/v1/chat/completions -H 'Content-Type: application/json'{key} -d '{body}'\n"
            f"  python -c \"from openai import OpenAI; c = OpenAI(base_url='{url}/v1', api_key='{args.api_key or 'none'}'); "
            f"print(c.chat.completions.create(model='{model}', messages=[{{'role': 'user', 'content': 'Hello!'}}], "
            f"max_tokens=32).choices[0].message.content)\"")

async def _watch(args: ServerArgs, state: FrontendManager, procs: List[Any], server: Any) -> None:
    """打印就绪行；之后每半秒看一眼工作进程：有一个退出了，就让等着的请求收到 503，然后关掉服务。"""
    while not server.started:
        await asyncio.sleep(0.1)
    logger.info(ready_message(args))
    while True:
        await asyncio.sleep(0.5)
        dead = [p for p in procs if p.exitcode is not None]
        if dead:
            reason = f"{dead[0].name} exited with code {dead[0].exitcode}"
            logger.error(f"{reason}: failing all requests and shutting down")
            state.fail_all(reason)
            await asyncio.sleep(1.0)  # 让等着的请求先把 503 发出去
            server.should_exit = True
            return

async def _serve(args: ServerArgs, state: FrontendManager, procs: List[Any]) -> int:
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host=args.server_host, port=args.server_port,
                                           log_level="warning", timeout_graceful_shutdown=2))
    watch = asyncio.create_task(_watch(args, state, procs, server))
    await server.serve()
    watch.cancel()
    return 1 if state.dead is not None or not server.started else 0

def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM 和 Ctrl-C 走同一条路：finally 里收拾工作进程

def kill_workers() -> None:
    """结束本进程的所有子进程（连同它们的子进程）：先 terminate，5 秒后还在的 kill。"""
    children = psutil.Process().children(recursive=True)
    for c in children:
        try:
            c.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(children, timeout=5)
    for c in alive:
        c.kill()

def launch_server(argv: List[str] | None = None, run_shell: bool = False) -> int:
    """python -m minisgl 的入口：解析参数、绑定前端队列、拉起工作进程、起 HTTP 服务（或交互 shell）。返回退出码。"""
    args = parse_args(sys.argv[1:] if argv is None else argv, run_shell=run_shell)
    signal.signal(signal.SIGTERM, _interrupt)
    state = create_frontend(args)
    try:
        procs = start_backend(args)
        if args.shell:
            from minisgl.shell import run_shell as shell

            asyncio.run(shell(state))
            return 0
        return asyncio.run(_serve(args, state, procs))
    except WorkerError as e:
        logger.error(str(e))
        return 1
    except KeyboardInterrupt:
        logger.info("interrupted: shutting down")
        return 0
    finally:
        kill_workers()
        state.shutdown()
