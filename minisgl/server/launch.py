# Tangled from book/chapters/ch15_server.ipynb — edit the notebook, not this file.
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import multiprocessing as mp
import os
import queue
import signal
import socket
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Dict, List

import psutil
import torch
from tqdm import tqdm

from minisgl.core import Batch
from minisgl.distributed import DistributedInfo
from minisgl.message import SchedulerStats
from minisgl.scheduler import Scheduler
from minisgl.utils import cpu_cores, init_logger, pick_device
from minisgl.utils.mp import ZmqPushQueue, watch_parent

from .api_server import FrontendManager, app, create_frontend
from .args import ServerArgs, model_limits, parse_args

logger = init_logger(__name__)

STARTUP_TIMEOUT = 600.0  # 秒：加载大模型、录 CUDA Graph 都算在里面
NODE_GONE_GRACE = 10.0  # 秒：另一个节点走了、本节点还有请求在算时，等本节点的调度器自己退出的上限


class ServingScheduler(Scheduler):
    """服务里的调度器：第 14 章的 Scheduler，加上 rank 0 把 SchedulerStats 推给 API Server（/metrics 用）。"""

    STATS_INTERVAL = 0.25  # 秒：忙的时候最多这么频繁；空下来时立刻推一次（/metrics 回到 0）

    def __init__(self, config: ServerArgs) -> None:
        super().__init__(config)
        primary = config.tp_info.is_primary()
        self._stats_queue = ZmqPushQueue(config.zmq_frontend_addr, create=False) if primary else None
        self._stats_sent: SchedulerStats | None = None
        self._stats_time = 0.0
        self.push_stats(force=True)

    def push_stats(self, force: bool = False) -> None:
        """离上次推过 STATS_INTERVAL 秒（或者 force）时推一次统计；内容没变就不推。"""
        if self._stats_queue is None or not (force or time.monotonic() - self._stats_time > self.STATS_INTERVAL):
            return
        stats = self.stats()
        if stats != self._stats_sent:
            self._stats_queue.put(stats)
            self._stats_sent, self._stats_time = stats, time.monotonic()

    def run_step(self) -> bool:
        busy = super().run_step()
        self.push_stats(force=not self.has_work)  # 空下来时立刻推：/metrics 马上回到 0
        return busy

    def schedule_next_batch(self) -> Batch | None:
        batch = super().schedule_next_batch()
        if batch is not None:
            self.push_stats()  # 开算之前也推：CPU 上几千个 token 的 prefill 一步就是十几秒
        return batch

    def shutdown(self) -> None:
        if self._stats_queue is not None:
            self._stats_queue.stop()
        super().shutdown()

def _num_threads(args: ServerArgs) -> int | None:
    """调度器进程的 torch 线程数：--num-threads；没给就是 GPU 上 1，CPU 上本进程能用的核平分给本机的 rank。
    没给 --num-threads 而设了 OMP_NUM_THREADS 时听它的（None：引擎不动线程数）。"""
    if args.num_threads is not None:
        return args.num_threads
    if "OMP_NUM_THREADS" in os.environ:
        return None
    if pick_device(args.device).type == "cuda":
        return 1  # 模型在 GPU 上算，这个进程的 CPU 只拼小张量：多余的 OpenMP 线程只会空转着抢核
    return max(1, cpu_cores() // (args.tp_info.size // args.nnodes))

def _run_scheduler(args: ServerArgs, ack_queue: mp.Queue | None) -> None:
    watch_parent()  # 启动器被 kill -9 时跟着退出（第 12 章）
    tqdm.set_lock(threading.RLock())  # 加载权重的进度条不建跨进程的锁：见下面的说明
    args = replace(args, num_threads=_num_threads(args))  # 引擎按它设 torch 的线程数
    with torch.inference_mode():
        try:
            scheduler = ServingScheduler(args)
        except ValueError as e:  # 配置用不了（KV 池放不下一个请求、CPU 上的 --attn fi……）：一行说清，不要 traceback
            logger.error(str(e))
            sys.exit(2)
        scheduler.sync_all_ranks()  # 所有 rank 都初始化完（包括 ZMQ 订阅）再开始
        if ack_queue is not None and args.tp_info.is_primary():
            ack_queue.put("Scheduler is ready")
    if args.silent_output:
        logging.disable(logging.INFO)
    try:
        scheduler.run_forever()  # 第 14 章：收消息、跑一步；Ctrl-C 或 ExitMsg 时清理退出
    except RuntimeError as e:
        # 另一个 rank 不在了（它的节点退出、被 kill），本 rank 死在下一次集合通信里：gloo 报 "Connection reset by
        # peer" 或 "closed by peer"；它卡住了（机器挂起），等满 gloo 的 60 秒报 "Timed out"。原因由启动器说
        # （"node 1 went away"），这里一行就够，不打几十行的 traceback
        gone, stuck = "by peer" in str(e), "Timed out" in str(e)
        if args.tp_info.size == 1 or not (gone or stuck):
            raise
        what = "went away" if gone else "did not answer within gloo's timeout"
        logger.error(f"TP{args.tp_info.rank}: another rank {what} during a collective: exiting")
        sys.exit(1)


class WorkerError(RuntimeError):
    """一个工作进程没能就绪（或者就绪前就退出了）。"""

def _ignoring_sigint(target: Callable[..., None], *args: Any, **kwargs: Any) -> None:
    """工作进程的入口：终端里的 Ctrl-C 发给整个进程组，工作进程不理会——服务由启动器停下（uvicorn 收到 Ctrl-C），
    --shell 只停当前的回答（见 shell.py）；退出由启动器收拾（kill_workers），启动器不在了由 watch_parent 发现。
    要是工作进程也响应，它们会在随便哪一行抛出 KeyboardInterrupt（正在关 ZMQ 时），各打一段 traceback，还会抢在
    启动器前面退出。"""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    target(*args, **kwargs)

def start_backend(server_args: ServerArgs, links: List[NodeLink] | None = None) -> List[mp.Process]:
    """启动本节点的后端进程：本节点的每个 TP rank 一个调度器进程；节点 0 再加一个 detokenizer、若干 tokenizer，
    并等它们都就绪（其他节点只有调度器，不等：rank 0 在节点 0 上，就绪由它报告）。links：其他节点，等的时候也看着。"""
    from minisgl.tokenizer import tokenize_worker

    ctx = mp.get_context("spawn")  # CUDA 不支持 fork 出来的子进程
    ack_queue = ctx.Queue()
    world_size = server_args.tp_info.size
    procs: List[Any] = []

    def start(name: str, target: Any, *args: Any, **kwargs: Any) -> None:
        p = ctx.Process(target=_ignoring_sigint, args=(target, *args), kwargs=kwargs, name=name, daemon=True)
        p.start()
        procs.append(p)

    per_node = world_size // server_args.nnodes
    for local in range(per_node):  # 节点 r 上是全局的 rank r*per_node .. (r+1)*per_node-1
        rank = server_args.node_rank * per_node + local
        start(f"minisgl-TP{rank}-scheduler", _run_scheduler,
              replace(server_args, tp_info=DistributedInfo(rank, world_size),
                      device=_local_device(server_args.device, local)),
              ack_queue if server_args.node_rank == 0 else None)  # 函数返回后这个队列就没了：别的节点不传
    if server_args.node_rank > 0:
        return procs
    n = server_args.num_tokenizer
    common = dict(tokenizer_path=str(server_args.model_path), backend_addr=server_args.zmq_backend_addr,
                  frontend_addr=server_args.zmq_frontend_addr, ack_queue=ack_queue,
                  max_seq_len=model_limits(server_args)[0])  # 放不下的请求在分词时就拒绝（第 13 章）
    start("minisgl-detokenizer", tokenize_worker, **common, addr=server_args.zmq_detokenizer_addr,
          create=True, tokenizer_id=n, wait_for_info=n > 0)  # token 先于登记到达时等登记（第 13 章）
    for i in range(n):  # 单独的 tokenizer 把 stop 字符串和提示词长度告诉 detokenizer（第 13 章）
        start(f"minisgl-tokenizer-{i}", tokenize_worker, **common, addr=server_args.tokenizer_addrs[i],
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
            for link in links or []:
                if link.recv(timeout=0) is None:
                    raise WorkerError(f"node {link.node_rank} went away before it was ready (see its log)")
            if time.monotonic() > deadline:
                raise WorkerError(f"the workers were not ready within {STARTUP_TIMEOUT:.0f} s")
    return procs

def _local_device(name: str, local_rank: int) -> str:
    """CUDA 上每台机器的 GPU 都从 0 编号：本节点第 local_rank 个 rank 用 cuda:local_rank（引擎默认按全局 rank 选）。"""
    device = pick_device(name)
    return f"cuda:{local_rank}" if device.type == "cuda" and device.index is None else name


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

async def _watch(args: ServerArgs, state: FrontendManager, procs: List[Any], links: List[NodeLink],
                 server: Any, died: List[str]) -> None:
    """打印就绪行；之后每半秒看一眼工作进程和其他节点：有一个退出了，记进 died、让等着的请求收到 503，然后关掉服务。"""
    while not server.started:
        await asyncio.sleep(0.1)
    logger.info(ready_message(args))
    while True:
        await asyncio.sleep(0.5)
        # 节点先看：一个节点走了，本节点的调度器 rank 随后死在集合通信里（gloo 报 connection reset）——原因是前者
        gone = [link.node_rank for link in links if link.recv(timeout=0) is None]
        dead = [f"node {rank} went away" for rank in gone]
        dead += [f"{p.name} exited with code {p.exitcode}" for p in procs if p.exitcode is not None]
        if dead:
            reason = dead[0]
            died.append(reason)  # 先记下：接下来的 1 秒里来一个 Ctrl-C，退出码也还是 1
            logger.error(f"{reason}: failing all requests and shutting down")
            busy = bool(state.event_map)  # 有请求在等：本节点的调度器正在算，下一次集合通信就会发现
            state.fail_all(reason)
            await asyncio.sleep(1.0)  # 让等着的请求先把 503 发出去
            if busy and gone:  # 原因是走了的节点：让调度器自己死在集合通信里、记下那一行，再去结束它们
                deadline = time.monotonic() + NODE_GONE_GRACE
                while any(p.exitcode is None for p in procs if p.name.endswith("-scheduler")) \
                        and time.monotonic() < deadline:
                    await asyncio.sleep(0.1)
            server.should_exit = True
            return

def listen_socket(args: ServerArgs) -> socket.socket:
    """HTTP 服务的监听 socket，在拉起工作进程、加载模型之前绑定：坏的 --host、被占的 --port 立刻是一行错误。"""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(args.server_host, args.server_port,
                                                          type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as e:
        raise ValueError(f"--host {args.server_host!r} is invalid: {e.strerror}") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as e:
        sock.close()
        raise ValueError(f"--host {args.server_host} --port {args.server_port}: cannot listen there: "
                         f"{e.strerror}") from None
    return sock

async def _serve(args: ServerArgs, state: FrontendManager, procs: List[Any], links: List[NodeLink],
                 sock: socket.socket, interrupts: List[int], died: List[str]) -> int:
    """HTTP 服务，直到 Ctrl-C、SIGTERM 或某个工作进程退出。interrupts：uvicorn 接管信号之前（和交还之后）来的
    Ctrl-C / SIGTERM，由 launch_server 装的处理函数记下；died：_watch 看到的工作进程或节点的退出。"""
    import uvicorn

    loop = asyncio.get_running_loop()

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            """第一次 Ctrl-C / SIGTERM：还在等回复的请求马上以 503（流式的是一个 error 事件）结束——工作进程就要被结束，
            回复不会再来；不然 uvicorn 体面关闭的 2 秒一到就取消它们，客户端拿到纯文本的 500 或截断的流。fail_all 由
            事件循环在两个回调之间调用，不在信号打断的那一行中间改那几张表。
            已经在停了又来一个 SIGINT（再按一次 Ctrl-C，GNU timeout 把它转发给整个进程组）：不记。记下的话 uvicorn
            把它当成"强行退出"，不等还开着的流体面地关掉；体面的关闭最多 2 秒，用不着强行退出。"""
            if self.should_exit and sig == signal.SIGINT:
                return
            loop.call_soon_threadsafe(state.fail_all, f"stopped by {signal.Signals(sig).name}")
            super().handle_exit(sig, frame)

    server = Server(uvicorn.Config(app, host=args.server_host, port=args.server_port,
                                   log_level="warning", timeout_graceful_shutdown=2))
    server.should_exit = bool(interrupts)  # 还没开始服务就被打断了：uvicorn 起来就停
    watch = asyncio.create_task(_watch(args, state, procs, links, server, died))
    await server.serve(sockets=[sock])  # 之后来的信号落到 interrupts 里：只是记下
    watch.cancel()
    return 1 if died or not server.started else 0

def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM 和 Ctrl-C 走同一条路：finally 里收拾工作进程

def _shutting_down() -> None:
    """开始收尾之后不再理会 Ctrl-C 和 SIGTERM：再按一次 Ctrl-C（或 GNU timeout 把 SIGINT 再转发一次）会在收尾的
    半路抛出 KeyboardInterrupt——kill_workers 等子进程的时候、asyncio 收拾任务的时候——打出一段 traceback，退出码也
    成了 -2。收尾有期限（kill_workers 最多等 5 秒就 kill），用不着第二次打断它。"""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)

def _is_resource_tracker(p: psutil.Process) -> bool:
    try:
        return "multiprocessing.resource_tracker" in " ".join(p.cmdline())
    except psutil.Error:  # 已经退出了
        return False

def kill_workers() -> None:
    """结束本进程的所有子进程（连同它们的子进程）：先 terminate，5 秒后还在的 kill。
    multiprocessing 的 resource tracker 除外：它忽略 SIGTERM，terminate 它只会白等 5 秒；本进程一退出它就收尾退出。"""
    children = [c for c in psutil.Process().children(recursive=True) if not _is_resource_tracker(c)]
    for c in children:
        try:
            c.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(children, timeout=5)
    for c in alive:
        c.kill()

def exit_code(run: Callable[[], int]) -> int:
    """启动器的退出码（两种节点共用）：run 的返回值；WorkerError 记一行错误、返回 1；Ctrl-C / SIGTERM 返回 0。"""
    try:
        return run()
    except WorkerError as e:
        logger.error(str(e))
        return 1
    except KeyboardInterrupt:
        _shutting_down()
        logger.info("interrupted: shutting down")
        return 0


def launch_server(argv: List[str] | None = None, run_shell: bool = False) -> int:
    """python -m minisgl 的入口：解析参数、绑定前端队列、拉起工作进程、起 HTTP 服务（或交互 shell）。返回退出码。"""
    args = parse_args(sys.argv[1:] if argv is None else argv, run_shell=run_shell)
    torch.set_num_threads(1)  # 这个进程只收发 HTTP 和消息：不让 torch 的线程和调度器抢核
    signal.signal(signal.SIGTERM, _interrupt)
    if args.node_rank > 0:
        return serve_node(args)  # 其他节点：只有本节点的调度器 rank，没有 API Server 和分词进程
    try:
        sock = None if args.shell else listen_socket(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)  # 和 parse_args 的错误一样：一行，退出码 2
        return 2
    state = create_frontend(args)
    links: List[NodeLink] = []

    def run() -> int:
        links.extend(accept_nodes(args) if args.nnodes > 1 else [])
        procs = start_backend(args, links)
        for link in links:
            link.send("ready")
        if args.shell:
            from minisgl.shell import run_shell as shell

            logging.disable(logging.INFO)  # 对话里不夹日志（Ctrl-C 停下回答时的 "Aborting request"）；警告照常
            asyncio.run(shell(state))
            return 0
        assert sock is not None
        # uvicorn 接管信号之前（import uvicorn、建 Server 的那一段）来的 Ctrl-C 也只是记下：asyncio.run 见到 SIGINT
        # 还是默认的处理函数，就装上它自己的——取消主任务，uvicorn 启动到一半被取消，打出一段 CancelledError
        interrupts: List[int] = []
        died: List[str] = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda signum, frame: interrupts.append(signum))
        code = asyncio.run(_serve(args, state, procs, links, sock, interrupts, died))
        if interrupts and not died:
            raise KeyboardInterrupt  # 和别处的 Ctrl-C 一样：exit_code 记一行、返回 0
        return code

    code = 1  # exit_code 之外的异常（我们的 bug）照样往外抛，其他节点也以 1 退出
    try:
        code = exit_code(run)
        return code
    finally:
        _shutting_down()
        for link in links:  # 先告诉其他节点退出（带上本节点的退出码），再收拾本机的工作进程
            link.send(f"exit {code}")
            link.close()
        kill_workers()
        state.shutdown()


class NodeLink:
    """两台机器的启动器之间的一条 TCP 连接，一行一条消息（hello / go / ready / exit CODE / error）。
    连接断开就说明对面的启动器不在了：不需要心跳。"""

    def __init__(self, sock: socket.socket, node_rank: int = 0) -> None:
        self.sock, self.node_rank, self._buf = sock, node_rank, b""

    def send(self, line: str) -> None:
        try:
            self.sock.settimeout(5.0)  # recv(timeout=0) 把 socket 设成了非阻塞：发送时换回有期限的阻塞
            self.sock.sendall(line.encode() + b"\n")
        except OSError:
            pass  # 对面已经走了：它那边自己会发现

    def recv(self, timeout: float) -> str | None:
        """下一行；timeout 秒内没有完整的一行返回 ""；连接已断开返回 None。timeout=0：只看一眼，不等。"""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            self.sock.settimeout(max(deadline - time.monotonic(), 0.0))
            try:
                data = self.sock.recv(4096)
            except (TimeoutError, BlockingIOError):
                return ""
            except OSError:
                return None
            if not data:
                return None
            self._buf += data
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode()

    def close(self) -> None:
        self.sock.close()

def _must_agree(args: ServerArgs) -> Dict[str, Any]:
    """每个节点必须相同的设置：不同的话各 rank 排出的批不一样、录的图不一样，集合通信对不上；模型（同名目录里的
    config.json 逐字节比）和 --dummy-weight 不同时，通信对得上，答案却是错的。KV 池的页数不在这里：引擎在各 rank
    之间取最小（各卡的空闲显存本来就不一样）。"""
    config = hashlib.sha256((Path(args.model_path) / "config.json").read_bytes()).hexdigest()[:12]
    return {"--tp": args.tp_info.size, "--nnodes": args.nnodes, "--model": args.served_model_name,
            "--model (its config.json, sha256)": config, "--dummy-weight": args.use_dummy_weight,
            "--device": pick_device(args.device).type, "--attn": args.attention_backend,
            "--moe-backend": args.moe_backend, "--cuda-graph-max-bs": args.cuda_graph_max_bs,
            "--dtype": args.dtype, "--page-size": args.page_size, "--num-pages": args.num_pages,
            "--max-running-requests": args.max_running_req, "--max-seq-len-override": args.max_seq_len_override,
            "--max-prefill-length": args.max_extend_tokens, "--cache": args.cache_type,
            "--disable-overlap-scheduling": not args.enable_overlap}

def accept_nodes(args: ServerArgs) -> List[NodeLink]:
    """节点 0：在 PORT+1 上等另外 nnodes-1 个节点报到（最多 --dist-timeout 秒），核对设置，然后让它们开始。"""
    host, port = args.dist_host_port
    flag = f"--dist-init-addr {host}:{port}"
    try:
        for p in (port, port + 2):  # torch.distributed 和 PUB 的端口：先试一下绑不绑得上
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # 和 TCPStore、ZMQ 一样：不怕 TIME_WAIT
                s.bind((host, p))
        listener = socket.create_server((host, port + 1))
    except OSError as e:
        raise WorkerError(f"{flag}: node 0 cannot listen there ({e.strerror}); on node 0 it must be one of this "
                          f"machine's addresses, with ports {port}..{port + 2} free") from None
    links: Dict[int, NodeLink] = {}
    mine = _must_agree(args)  # 读一次 config.json：每个报到的节点都和它比
    deadline = time.monotonic() + args.dist_timeout
    try:
        while len(links) < args.nnodes - 1:
            listener.settimeout(max(deadline - time.monotonic(), 0.01))
            try:
                sock, _ = listener.accept()
            except TimeoutError:
                missing = sorted(set(range(1, args.nnodes)) - set(links))
                raise WorkerError(f"{flag}: node(s) {missing} did not join within {args.dist_timeout:g} s "
                                  f"(start them with the same --dist-init-addr and --nnodes {args.nnodes})") from None
            link, rank, theirs = _hello(sock, timeout=max(deadline - time.monotonic(), 1.0))
            if link is None:
                continue  # 不是我们的节点（端口扫描、连上又断了）：不理它
            if rank in links:  # 同一个 --node-rank 起了两次：先到的留下，后到的被告知原因，节点 0 接着等别的节点
                link.send(f"error node {rank} has already joined: is it started twice?")
                link.close()
                continue
            diff = [k for k in mine if mine[k] != theirs.get(k)]
            if diff:
                error = (f"node {rank} was started with {diff[0]} {theirs.get(diff[0])}, node 0 with "
                         f"{diff[0]} {mine[diff[0]]}: every node needs the same settings")
                link.send(f"error {error}")
                link.close()
                raise WorkerError(f"{flag}: {error}")
            links[rank] = link
            logger.info(f"node {rank} joined ({len(links) + 1}/{args.nnodes})")
    except BaseException:
        listener.close()
        for link in links.values():
            link.close()
        raise
    for link in links.values():
        link.send("go")
    threading.Thread(target=_refuse_late_nodes, args=(listener, args), daemon=True).start()
    return list(links.values())

def _hello(sock: socket.socket, timeout: float) -> tuple[NodeLink | None, int, Dict[str, Any]]:
    """读一个新连接的第一行：是我们的节点（"minisgl [rank, 设置]"）就返回连接、它的 --node-rank 和设置；
    不是（端口扫描、连上又断了）就关掉连接，返回 (None, -1, {})。"""
    link = NodeLink(sock)
    try:
        rank, theirs = json.loads((link.recv(timeout=timeout) or "").removeprefix("minisgl "))
        link.node_rank = int(rank)
        return link, link.node_rank, dict(theirs)
    except (ValueError, TypeError):
        link.close()
        return None, -1, {}

def _refuse_late_nodes(listener: socket.socket, args: ServerArgs) -> None:
    """节点 0 开始之后仍在 PORT+1 上接听，直到退出：来晚的节点（同一个 --node-rank 起了两次、--nnodes 数错了）
    马上被告知原因。不接听的话它连不上，只能重试到 --dist-timeout，再说"节点 0 没有应答"——节点 0 明明在。"""
    listener.settimeout(None)
    while True:
        try:
            sock, _ = listener.accept()
        except OSError:
            return
        link, rank, _ = _hello(sock, timeout=5.0)
        if link is not None:
            link.send(f"error all {args.nnodes} nodes have already joined and node 0 has started; "
                      f"is node {rank} started twice?")
            link.close()

def join_node0(args: ServerArgs) -> NodeLink:
    """节点 r > 0：连上节点 0 的 PORT+1（它可能还没起来：重试到 --dist-timeout），报到，等它说 go。"""
    host, port = args.dist_host_port
    flag = f"--dist-init-addr {host}:{port}"
    deadline = time.monotonic() + args.dist_timeout
    while True:
        try:
            sock = socket.create_connection((host, port + 1), timeout=max(deadline - time.monotonic(), 0.1))
            break
        except OSError:
            if time.monotonic() > deadline:
                raise WorkerError(f"{flag}: node 0 did not answer within {args.dist_timeout:g} s (is it started "
                                  f"with this --dist-init-addr, and is {host}:{port + 1} reachable from here?)") \
                    from None
            time.sleep(0.5)
    link = NodeLink(sock)
    link.send("minisgl " + json.dumps([args.node_rank, _must_agree(args)]))
    reply = link.recv(timeout=args.dist_timeout)  # 节点 0 在等其他节点：最多它的 --dist-timeout
    if reply == "go":
        return link
    link.close()
    if reply is not None and reply.startswith("error "):
        raise WorkerError(f"{flag}: node 0 refused this node: {reply[6:]}")
    raise WorkerError(f"{flag}: node 0 did not start this node (" +
                      ("it closed the connection; its log says why)" if reply is None else "no answer)"))

def serve_node(args: ServerArgs) -> int:
    """节点 r > 0 的启动器：报到，起本节点的调度器 rank，然后守着——直到节点 0 说 exit（退出码跟节点 0 的一样）、
    节点 0 不在了或者本节点的一个 rank 退出（1）、或者收到 SIGTERM / Ctrl-C（0）。"""
    links: List[NodeLink] = []  # 报到成功后的那一条连接

    def run() -> int:
        links.append(join_node0(args))
        procs = start_backend(args)
        logger.info(f"node {args.node_rank}: started {', '.join(p.name for p in procs)}")
        while True:
            line = links[0].recv(timeout=0.5)
            dead = [p for p in procs if p.exitcode is not None]
            if dead:  # 先看本节点的 rank：它死了，节点 0 随后发来的 exit 只是这件事的后果
                logger.error(f"{dead[0].name} exited with code {dead[0].exitcode}: shutting down")
                return 1
            if line == "ready":
                logger.info(f"node {args.node_rank}: serving; the API server is on node 0")
            elif line is not None and line.startswith("exit"):
                code = int(line.removeprefix("exit") or 0)
                logger.log(logging.ERROR if code else logging.INFO,
                           f"node {args.node_rank}: node 0 is shutting down (exit code {code}), so is this node")
                return code
            elif line is None:
                logger.error(f"node {args.node_rank}: node 0 went away: shutting down")
                return 1

    try:
        return exit_code(run)
    finally:
        _shutting_down()
        for link in links:
            link.close()
        kill_workers()
