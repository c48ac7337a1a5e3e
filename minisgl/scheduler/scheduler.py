# Tangled from book/chapters/ch09_continuous_batching.ipynb and ch10_chunked_prefill.ipynb and ch11_overlap.ipynb and ch17_structured.ipynb — edit the notebooks, not this file.
from __future__ import annotations

import threading
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import replace
from typing import Dict, List, NamedTuple, Set, Tuple

import torch
import torch.distributed as dist

from minisgl.core import Batch, Req
from minisgl.engine import Engine, ForwardOutput, LogprobsOutput
from minisgl.message import (AbortBackendMsg, BaseBackendMsg, BatchBackendMsg, DetokenizeMsg, ExitMsg, SchedulerStats,
                             UserMsg)
from minisgl.structured import Grammar, GrammarBackend, allocate_vocab_mask, fill_vocab_mask
from minisgl.utils import init_logger

from .cache import CacheManager
from .config import SchedulerConfig
from .decode import DecodeManager
from .io import SchedulerIOMixin
from .prefill import PrefillManager
from .table import TableManager
from .utils import PendingReq, eos_token_ids, num_outputs

logger = init_logger(__name__)

GRAMMAR_POLL_S = 0.005  # 附录：只剩语法还在编译的请求时，每次最多等这么久就回去收消息


def schedule_policy(prefill: PrefillManager, decode: DecodeManager, cache: CacheManager,
                    budget: int, admit: bool = True) -> Batch | None:
    """混合批：运行中的请求每步各 decode 一个 token；剩下的 token 预算给 prefill——分块请求的下一块和排队的
    新请求。没有要 prefill 的，就是一个纯 decode 批（GPU 上能用 CUDA Graph）。"""
    running = decode.ready()
    cache.grow(running)  # decode 的请求先拿页（调度器已经保证够用），剩下的才给分块请求的下一块
    batch = prefill.schedule_next_batch(max(budget - len(running), 1), admit)  # 至少 1 个：新请求不会被饿死
    if batch is None:
        return Batch(running, "decode") if running else None
    if not running:
        return batch
    return Batch(running + batch.reqs, "prefill")


def make_reply(req: Req, token: int, reason: str | None, cached_tokens: int, logprobs: LogprobsOutput | None,
               row: int) -> DetokenizeMsg:
    """一个新 token 的回复。请求要了 logprobs 时带上它这一行的对数概率（第 8 章的引擎算好、已经在 CPU 上）。"""
    msg = DetokenizeMsg(req.uid, token, reason is not None, reason, cached_tokens=cached_tokens)
    sp = req.sampling_params
    if sp.logprobs:
        assert logprobs is not None, f"request {req.uid} asked for logprobs but the engine computed none"
        msg.logprob = float(logprobs.token_logprobs[row])
        if sp.top_logprobs:
            msg.top_ids = logprobs.top_ids[row, :sp.top_logprobs].tolist()
            msg.top_logprobs = logprobs.top_logprobs[row, :sp.top_logprobs].tolist()
    return msg


class Scheduler(SchedulerIOMixin):
    """一个 TP rank 上的调度器：收请求、每步挑一批（混合批：运行中的请求各 decode 一个 token，剩下的预算给 prefill，第 10 章）、交给引擎、处理结果、释放资源。

    输入是 receive_msg(消息)，输出是 send_result(DetokenizeMsg 列表)：离线的 LLM 自己实现 send_result；
    配置里给了 zmq_backend_addr 时是一个服务进程（第 14 章），收发由 SchedulerIOMixin 经 ZMQ 完成。
    """

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.engine = Engine(config)
        e = self.engine
        self.table = TableManager(config.max_running_req, e.page_table)
        self.cache = CacheManager(e.page_table, e.num_pages, config.page_size, config.cache_type)
        self.running: Dict[int, Req] = {}  # 占着槽和页的请求（prefill 中或 decode 中），按接纳的先后
        self.prefill = PrefillManager(self.cache, self.table, self.running, config.admission == "optimistic")
        self.decode = DecodeManager()
        self.eos_ids = eos_token_ids(config.model_path)
        self._first_hit: Dict[int, int] = {}  # 第一个 token 还没发出的请求 → 提示词命中缓存的 token 数
        self.num_retracted = 0  # 撤回过多少次（累计）
        self._in_flight: Set[int] = set()  # 已经提交给 GPU、结果还没处理的那一步里的请求（第 11 章）
        self._deferred: Dict[int, Req] = {}  # 已经结束、但还在飞行中的那一步里：等那一步算完再释放
        self._last: LaunchedStep | None = None
        self.exiting = False
        # 附录·结构化输出：受约束的请求各有一个语法状态（uid → Grammar，撤回时留着）；后端和掩码第一次用到时才建
        self.grammars: Dict[int, Grammar] = {}
        # 语法还在编译的请求：uid → (请求, 编译结果的 future)，按到达的先后。编译好了才进等待队列，不占槽和页
        self._compiling: Dict[int, Tuple[PendingReq, Future]] = {}
        self._compile_pool: ThreadPoolExecutor | None = None  # 编译线程：第一个要编译的 spec 来时才建
        self._grammar_backend: GrammarBackend | None = None
        self._backend_lock = threading.Lock()  # 后端多半在编译线程里建，别处（基准测试）也可能要：只建一次
        self._mask_host: torch.Tensor | None = None  # [R, W] int32：CPU 上填（GPU 时是 pinned 内存）
        self._mask_device: torch.Tensor | None = None  # [R, W] int32：logits 所在的设备上
        if config.zmq_backend_addr is not None:  # 第 14 章：服务进程，消息经 ZMQ 收发
            self.init_io()

    # ------------------------------------------------------------------ 输入
    def receive_msg(self, msg: BaseBackendMsg) -> None:
        if isinstance(msg, BatchBackendMsg):
            for m in msg.data:
                self.receive_msg(m)
        elif isinstance(msg, UserMsg):
            self.add_request(msg)
        elif isinstance(msg, AbortBackendMsg):
            self.abort_request(msg.uid)
        elif isinstance(msg, ExitMsg):
            self.exiting = True
        else:
            raise TypeError(f"the scheduler cannot handle {type(msg).__name__}")

    def add_request(self, msg: UserMsg) -> None:
        """检查一个新请求放不放得下；放得下就排队，否则立刻以 abort 结束它（绝不让它在队列里挂起）。
        受约束的请求先交给编译线程，语法编译好了才排队（_admit_compiled）：调度循环不等编译。"""
        n, sp = len(msg.input_ids), msg.sampling_params
        if n == 0 or n >= self.engine.max_seq_len:
            self._refuse(msg.uid, "the prompt is empty" if n == 0 else
                         f"the prompt has {n} tokens; this server takes at most {self.engine.max_seq_len - 1}")
            return
        left = self.engine.max_seq_len - n  # 引擎保证池子装得下一个 max_seq_len 的请求
        if sp.max_tokens is None or sp.max_tokens > left:  # 没给：生成到上下文用完；给多了：截到上限
            sp = replace(sp, max_tokens=left)
        req = PendingReq(msg.uid, msg.input_ids, sp)
        if sp.grammar is None:
            self.prefill.add(req)
        else:
            self._compiling[msg.uid] = (req, self._compile_grammar(*sp.grammar))

    def _refuse(self, uid: int, error: str) -> None:
        logger.warning(f"request {uid} refused: {error}")
        self.send_result([DetokenizeMsg(uid, -1, True, "abort")])

    def _compile_grammar(self, kind: str, spec: str) -> Future:
        """(kind, spec) 编译结果的 future。缓存里有：一个已经完成的 future，不排在别的编译后面；没有：交给编译线程。
        只开一个编译线程（xgrammar 编译一个 spec 时自己就用好几个线程）；同一个 spec 排了两次，第二次在那里命中缓存。"""
        backend = self._grammar_backend
        compiled = backend.cached(kind, spec) if backend is not None else None
        if compiled is not None:
            done: Future = Future()
            done.set_result(compiled)
            return done
        if self._compile_pool is None:
            self._compile_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="minisgl-grammar")
        return self._compile_pool.submit(lambda: self.grammar_backend.compile(kind, spec))

    def _admit_compiled(self) -> None:
        """语法编译好了的请求进等待队列（按到达的先后），编译不了的以 abort 结束；还在编译的下一步再看，不等。
        TP 下各 rank 的编译线程快慢不一：只放行在每个 rank 上都编译好了的，各 rank 的批才一样。"""
        if not self._compiling:
            return
        ready = [future.done() for _, future in self._compiling.values()]
        if self.config.tp_info.size > 1:
            ready = self._ready_on_all_ranks(ready)
        for uid, ok in zip(list(self._compiling), ready):
            if not ok:
                continue
            req, future = self._compiling.pop(uid)
            try:
                self.grammars[uid] = self.grammar_backend.state(future.result(), req.sampling_params.reasoning)
            except (ValueError, ImportError) as e:  # 编译不了（API 已经挡住了，离线的 LLM 才会送来）、没装 xgrammar
                self._refuse(uid, str(e))
                continue
            self.prefill.add(req)

    def _ready_on_all_ranks(self, ready: List[bool]) -> List[bool]:
        """各 rank 收到的消息一样，_compiling 也一样：按位取最小，就是在所有 rank 上都编译好了的。"""
        assert self._cpu_group is not None, "a TP scheduler exchanges grammar readiness over its gloo group"
        flags = torch.tensor(ready, dtype=torch.int32)
        dist.all_reduce(flags, op=dist.ReduceOp.MIN, group=self._cpu_group)
        return [bool(f) for f in flags.tolist()]

    def forget_in_flight(self) -> None:
        """一步算到半路抛了异常（显存不够、bug）之后调用：飞行中的那一步不会再有结果了，等着它的延迟释放现在就做。
        调用方随后中止自己的请求（LLM.generate）。"""
        self._last, self._in_flight = None, set()
        for req in self._deferred.values():
            self._release(req)
        self._deferred.clear()

    def abort_request(self, uid: int) -> None:
        """在任何状态下中止一个请求：排队中（包括被撤回的）、分块预填充中、decode 中、在飞行中的那一步里。
        资源只释放一次。"""
        compiling = self._compiling.pop(uid, None)
        if compiling is not None:  # 语法还在编译：还没占任何资源。还在排队的编译不做了，在做的做完（结果照样进缓存）
            compiling[1].cancel()
            self.send_result([DetokenizeMsg(uid, -1, True, "abort")])
            return
        if self.prefill.abort(uid):
            self._first_hit.pop(uid, None)
            self.grammars.pop(uid, None)
            self.send_result([DetokenizeMsg(uid, -1, True, "abort")])
            return
        req = self.running.get(uid)
        if req is None:  # 已经结束（或者根本没有这个请求）：什么也不做
            return
        self._finish(req)
        self.send_result([DetokenizeMsg(uid, -1, True, "abort")])

    # ------------------------------------------------------------------ 一步
    def schedule_next_batch(self) -> Batch | None:
        self._admit_compiled()
        retracted = self.make_room()
        batch = schedule_policy(self.prefill, self.decode, self.cache, self.config.max_extend_tokens, not retracted)
        if batch is not None and batch.is_prefill:
            for req in batch.reqs:
                if req.uid not in self.running:  # 新接纳的（或撤回后重新接纳的）请求：已知的 token 写进 token 表
                    self.running[req.uid] = req
                    self.table.token_pool[req.table_idx, :len(req.input_ids)] = \
                        req.input_ids.to(self.table.token_pool.device, non_blocking=True)
                    if num_outputs(req) == 0:
                        self._first_hit.setdefault(req.uid, req.cached_len)
        if not retracted and self.decode.running:
            self.prefill.on_decode_step()
        return batch

    def make_room(self) -> bool:
        """这一步要前进的请求（decode 的各多一个位置，分块中的至少一个 token）跨页时要新页。空闲 + 可淘汰的页
        不够时，撤回最近接纳的请求，直到够用；返回这一步撤回过没有。"""
        if not self.running and not self.prefill.pending:  # 空闲（没有运行的、也没有排队的）：估计回到初值
            self.prefill.reset_token_ratio()
        retracted = 0
        while self._pages_needed() > self.cache.available_pages:
            victims = [r for r in self.running.values() if r.remain_len > 0]
            if len(victims) > 1:
                self._retract(victims[-1])
                retracted += 1
            else:  # 只剩最早的一个：还缺的页在飞行中那一步已经结束的请求手里（延迟释放），先把那一步处理完
                assert self._last is not None, "one request alone always fits: the pool holds max_seq_len tokens"
                self._drain()
        if retracted:
            old = self.prefill.token_ratio
            self.prefill.reset_token_ratio()
            logger.info(f"KV pool full: retracted {retracted} request(s); token_ratio {old:.2f} -> "
                        f"{self.prefill.token_ratio:.2f}")
        return retracted > 0

    def _pages_needed(self) -> int:
        need = sum(self.cache.pages_to_grow(r.uid, r.device_len) for r in self.decode.ready())
        chunked = self.prefill.chunked
        return need + (self.cache.pages_to_grow(chunked.uid, chunked.cached_len + 1) if chunked else 0)

    def launch(self, batch: Batch, last: LaunchedStep | None = None) -> LaunchedStep:
        """提交一步。last：重叠时还没处理的上一步，在这里处理掉——批里有受约束的请求时，在前向之后、采样之前
        （这一步的掩码要等上一步的 token 被语法吃进去），否则在整步提交之后（和第 11 章一样）。"""
        has_token = [not r.is_chunked for r in batch.reqs]  # 在前向改动长度之前记下
        self.engine.prepare_batch(batch, self.table.token_pool)
        # 惩罚要数已经生成的 token：最新的那个还在设备上的 token 表里（第 8 章），CPU 上还没有
        args = self.engine.sampler.prepare(batch.reqs, token_pool=self.table.token_pool)
        if self.grammars and any(r.uid in self.grammars for r in batch.reqs):
            logits = self.engine.forward(batch)  # GPU 开始算这一步；CPU 接着做下面的事
            if last is not None:
                self.process(last)  # 上一步的 token：受约束的请求各自 accept，语法走完的以 stop 结束
                last = None
            rows = [self.grammars.get(r.uid) if ok else None for r, ok in zip(batch.reqs, has_token)]
            args.vocab_mask = self._vocab_mask(rows)
            out = self.engine.sample(logits, args)  # 盖掩码、采样
        else:  # 没有受约束的请求：和第 11 章一模一样
            out = self.engine.forward_batch(batch, args)
        # 新 token 直接在设备上写进 token 表：下一步的输入从那里取，不必等它拷回 CPU
        keep = [i for i, ok in enumerate(has_token) if ok]
        if keep:
            host = torch.tensor([[batch.reqs[i].table_idx, batch.reqs[i].cached_len, i] for i in keep])  # [K, 3]
            rows_d, cols_d, which = host.to(out.next_tokens_gpu.device, non_blocking=True).unbind(1)
            self.table.token_pool[rows_d, cols_d] = out.next_tokens_gpu[which]
        if last is not None:
            self.process(last)
        return LaunchedStep(batch, out, has_token)

    @property
    def grammar_backend(self) -> GrammarBackend:
        """第一个受约束的请求来时才建：读分词器每个 token 的字节要零点几秒到一秒（Qwen3 0.8 秒），不用结构化输出的服务不付这个钱。
        放行的结束符就是调度器认的 eos：语法放行的，调度器也认它是结束。"""
        with self._backend_lock:
            if self._grammar_backend is None:
                from minisgl.utils.hf import load_tokenizer

                self._grammar_backend = GrammarBackend(load_tokenizer(self.config.model_path),
                                                       self.engine.model_config.vocab_size, self.eos_ids)
            return self._grammar_backend

    def _vocab_mask(self, rows: List[Grammar | None]) -> torch.Tensor:
        """这一批的掩码 [B, W]，在 logits 的设备上。CPU 上填一块常驻的缓冲区，GPU 上再 non_blocking 地拷过去：
        下一次填它之前，process 已经等过这一步的 copy_done_event（排在这次拷贝之后），不会改到还没拷完的内存。"""
        if self._mask_host is None:
            R, V, dev = self.config.max_running_req, self.engine.model_config.vocab_size, self.engine.device
            self._mask_host = allocate_vocab_mask(R, V)
            self._mask_device = self._mask_host
            if dev.type == "cuda":
                self._mask_host = self._mask_host.pin_memory()
                self._mask_device = allocate_vocab_mask(R, V, dev)
        B = len(rows)
        host = self._mask_host[:B]
        fill_vocab_mask(rows, host, self.grammar_backend.batch)
        if self._mask_device is self._mask_host:
            return host
        device = self._mask_device[:B]
        device.copy_(host, non_blocking=True)
        return device

    def process(self, step: LaunchedStep) -> None:
        """一步的结果：每个请求的新 token，判断是否结束；结束的释放资源，prefill 完的插进前缀缓存、转入 decode。"""
        if step.out.copy_done_event is not None:
            step.out.copy_done_event.synchronize()
        replies = []
        tokens = step.out.next_tokens_cpu.tolist()
        for row, (req, token, has_token) in enumerate(zip(step.batch.reqs, tokens, step.has_token)):
            if req.uid in self._deferred:  # 已经结束：这一步的 token 丢掉；它不在飞行中的那一步里了，就释放
                if req.uid not in self._in_flight:
                    self._release(self._deferred.pop(req.uid))
                continue
            # 中止了的、被撤回的（它的 token 不发：恢复后重新生成）；或者分块还没算完、没有 token 的
            if self.running.get(req.uid) is not req or not has_token:
                continue
            grammar = self.grammars.get(req.uid)
            if grammar is not None and not grammar.accept(token):
                replies.append(self._grammar_refused(req, grammar, token))
                continue
            req.append_host(token)
            reason = self._finish_reason(req, token)
            replies.append(make_reply(req, token, reason, self._first_hit.pop(req.uid, 0), step.out.logprobs, row))
            if reason is not None:
                self._finish(req)
            elif req.uid not in self.decode.running:  # prefill 刚算完
                self.cache.cache_prompt(req)
                self.decode.add(req)
        if replies:
            self.send_result(replies)

    def _grammar_refused(self, req: Req, grammar: Grammar, token: int) -> DetokenizeMsg:
        """语法不接受采到的 token，结束这个请求。语法走进了死路（掩码全是 0，采到的 token 是随便哪个）：警告，以 length
        结束——输出是语法接受过的前缀、不完整，和 max_tokens 用完时一样；这条消息带上结束符（解码时跳过，文字不变）。
        否则是掩码的 bug：报错，只中止这一个请求。"""
        dead = grammar.is_dead
        self._finish(req)
        if dead:
            logger.warning(f"request {req.uid}: after {num_outputs(req)} tokens its grammar allows no next token "
                           f"(the output took a branch that can never be completed); ending it with 'length'")
            return DetokenizeMsg(req.uid, self.grammar_backend.stop_token_ids[0], True, "length")
        logger.error(f"request {req.uid}: token {token} was sampled outside its grammar's mask; aborting the request")
        return DetokenizeMsg(req.uid, -1, True, "abort")

    def step(self) -> bool:
        """不重叠的一步：挑批、前向、处理结果。没有事可做时返回 False。"""
        batch = self.schedule_next_batch()
        if batch is None:
            return False
        self.process(self.launch(batch))
        return True

    def overlap_step(self) -> bool:
        """重叠的一步：先把第 N 步提交给 GPU，再处理第 N-1 步的结果——CPU 的工作藏在 GPU 的计算后面。
        （附录：第 N-1 步的结果由 launch 处理，批里有受约束的请求时在前向和采样之间。）"""
        batch = self.schedule_next_batch()
        last, self._last = self._last, None
        self._in_flight = {r.uid for r in batch.reqs} if batch is not None else set()
        if batch is None:
            if last is not None:
                self.process(last)
            return last is not None
        self._last = self.launch(batch, last)
        return True

    def _drain(self) -> None:
        """不等下一步提交，先把飞行中的那一步处理完：延迟释放的请求随之释放（这一步没有重叠）。"""
        last, self._last = self._last, None
        self._in_flight = set()
        self.process(last)

    def run_step(self) -> bool:
        """跑一步。没有批可跑、只剩语法还在编译的请求时，等一小会儿编译（不空转），仍然返回 True：事情还没做完。"""
        if self.overlap_step() if self.config.enable_overlap else self.step():
            return True
        if not self._compiling:
            return False
        wait([future for _, future in self._compiling.values()], GRAMMAR_POLL_S, FIRST_COMPLETED)
        return True

    @property
    def has_work(self) -> bool:
        return bool(self.prefill.pending or self.prefill.chunked or self.running or self._last or self._compiling)

    def stats(self) -> SchedulerStats:
        """第 15 章 /metrics 的数；附录：语法还在编译的请求也算在排队的里面。"""
        stats = super().stats()
        stats.waiting += len(self._compiling)
        return stats

    # ------------------------------------------------------------------ 结束、撤回与释放
    def _finish_reason(self, req: Req, token: int) -> str | None:
        sp = req.sampling_params
        if (not sp.ignore_eos and token in self.eos_ids) or token in sp.stop_token_ids:
            return "stop"
        grammar = self.grammars.get(req.uid)
        if grammar is not None and grammar.is_terminated:  # 语法走完（吃进了结束符）：输出完整、合法
            return "stop"
        if req.host_len >= req.max_device_len:  # 数 CPU 上已有的 token：重叠时 device_len 已经走到下一步了
            return "length"
        return None

    def _finish(self, req: Req) -> None:
        """请求结束（或中止）：不再调度它；它若在飞行中的那一步里，等那一步算完再释放。"""
        del self.running[req.uid]
        self.decode.remove(req)
        self._first_hit.pop(req.uid, None)
        self.grammars.pop(req.uid, None)
        if req.uid in self._in_flight:
            self._deferred[req.uid] = req
        else:
            self._release(req)

    def _retract(self, req: Req) -> None:
        """撤回一个运行中的请求：它算过的整页留在前缀缓存里（不锁，需要时可以淘汰），别的页和请求槽还回去；它回到
        队首，以提示词 + 已经生成的 token 作为新的输入，之后接着生成——已经发出去的 token 不会重发。

        它可能在飞行中的那一步里：那一步只读写它自己的页，而这些页要到下一步（在同一条流上，排在那一步之后）
        才会分给别人，所以立刻释放；那一步给它采样的 token 在 process 里丢掉，恢复后重新生成。"""
        del self.running[req.uid]
        self.decode.remove(req)
        self.prefill.requeue(req)
        self._release(req)
        self.num_retracted += 1

    def _release(self, req: Req) -> None:
        self.cache.release(req)
        self.table.free(req.table_idx)

    def shutdown(self) -> None:
        """附录：还在编译的请求不要了；排队的编译取消，正在做的那一个做完，编译线程就退出（C++ 里的编译没法从外面打断）。"""
        self._compiling.clear()
        if self._compile_pool is not None:
            self._compile_pool.shutdown(wait=False, cancel_futures=True)
        self.engine.shutdown()


class LaunchedStep(NamedTuple):
    """提交给 GPU 的一步：批、引擎的输出，以及每个请求这一步有没有新 token（提交时就定了）。"""

    batch: Batch
    out: ForwardOutput
    has_token: List[bool]  # 分块预填充还没算完的请求没有
