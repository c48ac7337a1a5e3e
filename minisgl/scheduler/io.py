# Tangled from book/chapters/ch14_multiprocess.ipynb — edit the notebook, not this file.
from __future__ import annotations

import hashlib
import multiprocessing as mp
from dataclasses import replace
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Callable, Dict, List

import torch
import torch.distributed as dist

from minisgl.distributed import DistributedInfo, free_tcp_address
from minisgl.message import BatchTokenizerMsg, DetokenizeMsg, SchedulerStats
from minisgl.utils import init_logger

if TYPE_CHECKING:
    from minisgl.core import Req

    from .cache import CacheManager
    from .config import SchedulerConfig
    from .prefill import PrefillManager
    from .scheduler import Scheduler

logger = init_logger(__name__)

_PROBE = b""  # 握手时 rank 0 广播的空消息：真正的消息编码后从不为空，收到就丢掉
_MAX_MSGS_PER_STEP = 256  # rank 0 每步最多转发这么多条：远低于 ZMQ 默认的高水位 1000，PUB 不会丢消息


class SchedulerIOMixin:
    """调度器进程的收发：rank 0 从 tokenizer 收消息、把结果发给 detokenizer；TP > 1 时 rank 0 把收到的每条消息
    原样转发（PUB）给其他 rank（SUB），并广播"这一步有几条"——所有 rank 每一步处理完全相同的消息。"""

    config: SchedulerConfig  # 以下由 Scheduler 提供：config、exiting、has_work、receive_msg、run_step、shutdown，
    exiting: bool  # 以及 stats 数的 cache、prefill、running
    cache: CacheManager
    prefill: PrefillManager
    running: Dict[int, Req]
    _cpu_group: dist.ProcessGroup | None = None
    _recv = _send = _pub = _sub = None  # 没有 init_io（离线的 LLM）时都是 None

    def init_io(self) -> None:
        from minisgl.utils.mp import ZmqPubQueue, ZmqPullQueue, ZmqPushQueue, ZmqSubQueue  # zmq 用到才导入

        cfg, tp = self.config, self.config.tp_info
        if cfg.zmq_detokenizer_addr is None or (tp.size > 1 and cfg.zmq_broadcast_addr is None):
            raise ValueError(f"a scheduler process needs zmq_detokenizer_addr (got {cfg.zmq_detokenizer_addr!r}) "
                             f"and, with --tp {tp.size}, zmq_broadcast_addr (got {cfg.zmq_broadcast_addr!r})")
        self.num_received = 0  # 收到的消息条数；和 message_digest 一起，测试用来核对各 rank 收到的一样
        self._digest = hashlib.sha256()
        if tp.size > 1:  # 消息条数在 CPU 上广播：另开一个 gloo 组（CUDA 上默认的组是 NCCL）
            self._cpu_group = dist.new_group(backend="gloo")
        if tp.is_primary():
            self._recv = ZmqPullQueue(cfg.zmq_backend_addr, create=True)
            self._send = ZmqPushQueue(cfg.zmq_detokenizer_addr, create=False)
            if tp.size > 1:
                self._pub = ZmqPubQueue(cfg.zmq_broadcast_addr, create=True)
        else:
            self._sub = ZmqSubQueue(cfg.zmq_broadcast_addr, create=False)
        if tp.size > 1:
            self._handshake()

    def _handshake(self) -> None:
        """PUB 只发给已经订阅上的 SUB，订阅上之前发的直接丢掉（slow joiner）。rank 0 一轮轮地发探针，
        直到每个 rank 都收到过一个：之后发的消息一条也不会丢，而且按发送的顺序到达。"""
        got = torch.zeros(1)
        rounds = 0
        while True:
            rounds += 1
            if self._pub is not None:
                self._pub.put_raw(_PROBE)
                got.fill_(1)
            elif self._sub.socket.poll(timeout=50):  # type: ignore[union-attr]
                got.fill_(1)
            flag = got.clone()
            dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self._cpu_group)
            if flag.item() == 1:
                break
        logger.info_rank0(f"broadcast to {self.config.tp_info.size - 1} rank(s) ready after {rounds} probe(s)")

    def _next_broadcast(self) -> bytes:
        """rank > 0：SUB 上的下一条消息（阻塞），跳过握手留下的探针。"""
        while True:
            raw = self._sub.get_raw()  # type: ignore[union-attr]
            if raw != _PROBE:
                return raw

    def receive_msgs(self, blocking: bool = False) -> None:
        """取走已经到达的消息，交给 receive_msg。blocking：调度器没事可做，等到至少一条消息再返回。"""
        tp = self.config.tp_info
        raws: List[bytes] = []
        if tp.is_primary():
            if blocking:
                self._recv.socket.poll()  # type: ignore[union-attr]  # 等第一条到达（不取走）
            while len(raws) < _MAX_MSGS_PER_STEP and not self._recv.empty():  # type: ignore[union-attr]
                raws.append(self._recv.get_raw())  # type: ignore[union-attr]
            if self._pub is not None:
                for raw in raws:  # 原样转发字节：不用再编码一遍
                    self._pub.put_raw(raw)
                self._broadcast_count(len(raws))
        else:
            if blocking:  # 和 rank 0 一样没事可做：等 rank 0 转发来的第一条
                raws.append(self._next_broadcast())
            n = self._broadcast_count(0)
            while len(raws) < n:
                raws.append(self._next_broadcast())
            assert len(raws) == n, f"rank {tp.rank} got {len(raws)} messages, rank 0 sent {n}"
        self._digest.update(len(raws).to_bytes(4, "little"))
        for raw in raws:
            self._digest.update(raw)
        self.num_received += len(raws)
        decode = (self._recv or self._sub).decode  # type: ignore[union-attr]
        for raw in raws:
            self.receive_msg(decode(raw))

    def _broadcast_count(self, n: int) -> int:
        """rank 0 的 n 告诉所有 rank：这一步处理几条消息（每个 rank 在同一步看到同样的消息，批才一样）。"""
        t = torch.tensor([n], dtype=torch.int64)
        dist.broadcast(t, src=0, group=self._cpu_group)
        return int(t.item())

    def stats(self) -> SchedulerStats:
        """第 15 章 /metrics 的数（rank 0 推给 API Server）。页按 CacheManager.page_counts 数：pages_used 是运行中的
        请求在用的（自己的 + 锁着的缓存页），pages_cached 只数没有请求在用、可以淘汰的缓存页，pages_free 是空闲列表
        上的页（没有预留：按估计接纳，答应出去的页并不从空闲里扣）。"""
        used, cached, free = self.cache.page_counts()
        return SchedulerStats(running=len(self.running), waiting=len(self.prefill.pending), pages_used=used,
                              pages_cached=cached, pages_free=free, cached_tokens=self.cache.hit_tokens)

    @property
    def message_digest(self) -> str:
        """到目前为止收到的消息（含每一步的条数）的 SHA-256：两个 rank 相等，就说明收到的序列完全一样。"""
        return self._digest.hexdigest()[:16]

    def send_result(self, replies: List[DetokenizeMsg]) -> None:
        """一步的结果发给 detokenizer：一条 BatchTokenizerMsg。只有 rank 0 发，其他 rank 丢掉（结果一样）。"""
        if self._send is None:
            if self._sub is None:
                raise NotImplementedError("this scheduler has no zmq_backend_addr: the offline LLM implements "
                                          "send_result itself")
            return
        if replies:
            self._send.put(BatchTokenizerMsg(list(replies)))

    def sync_all_ranks(self) -> None:
        """所有 TP rank 在这里会合（CPU 上的 barrier）；TP=1 时什么都不做。"""
        if self.config.tp_info.size > 1:
            dist.barrier(group=self._cpu_group)

    def run_forever(self) -> None:
        """服务进程的主循环：收消息（没事可做时阻塞等）→ 跑一步；收到 ExitMsg 或 Ctrl-C 时退出并清理。"""
        try:
            with torch.inference_mode():
                while True:
                    self.receive_msgs(blocking=not self.has_work)
                    if self.exiting:
                        break
                    self.run_step()
        except KeyboardInterrupt:
            logger.info_rank0("scheduler interrupted")
        finally:
            for q in (self._recv, self._send, self._pub, self._sub):
                if q is not None:
                    q.stop()
            self.shutdown()
        logger.info(f"scheduler rank {self.config.tp_info.rank} exits after {self.num_received} messages "
                    f"(digest {self.message_digest})")


def run_scheduler_process(config: SchedulerConfig, ack_queue: mp.Queue | None = None) -> Scheduler:
    """一个调度器进程的入口：建调度器、等所有 rank 就绪、rank 0 报告"就绪"、一直服务到 ExitMsg。

    返回退出后的调度器（测试用它核对收到的消息）。
    """
    from .scheduler import Scheduler  # scheduler.py 导入本模块：在函数里导入，避免循环

    with torch.inference_mode():
        scheduler = Scheduler(config)
        scheduler.sync_all_ranks()  # 所有 rank 都建好（包括 ZMQ 的订阅）才开始接请求
    if config.tp_info.is_primary() and ack_queue is not None:
        ack_queue.put("Scheduler is ready")
    scheduler.run_forever()
    return scheduler


def start_scheduler_processes(config: SchedulerConfig, ack_queue: mp.Queue | None = None,
                              target: Callable[..., object] = run_scheduler_process) -> List[BaseProcess]:
    """用 spawn 为每个 TP rank 起一个调度器进程（config.tp_info.size 个）；TP > 1 且没给会合地址时选一个。"""
    size = config.tp_info.size
    if size > 1 and config.dist_init_addr is None:
        config = replace(config, dist_init_addr=free_tcp_address())
    ctx = mp.get_context("spawn")  # 不用 fork：子进程要自己初始化 CUDA、ZMQ
    procs = []
    for rank in range(size):
        p = ctx.Process(target=target, args=(replace(config, tp_info=DistributedInfo(rank, size)), ack_queue),
                        name=f"minisgl-TP{rank}-scheduler")
        p.start()
        procs.append(p)
    return procs
