# Tangled from book/chapters/ch13_tokenizer.ipynb — edit the notebook, not this file.
from __future__ import annotations

import multiprocessing as mp
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, List

import torch

from minisgl.message import (AbortBackendMsg, AbortMsg, BaseBackendMsg, BaseFrontendMsg, BaseTokenizerMsg,
                             BatchBackendMsg, BatchFrontendMsg, BatchTokenizerMsg, DetokenizeInfoMsg, DetokenizeMsg,
                             TokenizeMsg, UserReply)
from minisgl.utils import init_logger
from minisgl.utils.hf import load_tokenizer
from minisgl.utils.mp import ZmqPullQueue, ZmqPushQueue, watch_parent

from .detokenize import DetokenizeManager
from .tokenize import TokenizeManager

logger = init_logger(__name__)


@dataclass
class Outbox:
    backend: List[BaseBackendMsg] = field(default_factory=list)  # → 调度器
    frontend: List[BaseFrontendMsg] = field(default_factory=list)  # → API Server
    detokenizer: List[BaseTokenizerMsg] = field(default_factory=list)  # → detokenizer（只有单独的 tokenizer 进程用）


class TokenizerLoop:
    """一个分词进程对一批消息做的事，不碰套接字。

    to_detokenizer=False：这个进程自己反分词（--num-tokenizer 0 时唯一的进程，或者 N > 0 时的 detokenizer）；
    True：单独的 tokenizer 进程，反分词要用的信息转给 detokenizer。
    wait_for_info=True：N > 0 时的 detokenizer。每个请求的登记都会从 tokenizer 来，但和 token 走的是两条路，
    谁先到没有保证：登记之前到达的 token 先存着，登记一到再按顺序解码。
    max_seq_len：见 TokenizeManager。
    """

    def __init__(self, tokenizer: Any, to_detokenizer: bool = False, wait_for_info: bool = False,
                 max_seq_len: int | None = None) -> None:
        assert not (to_detokenizer and wait_for_info), "a tokenizer that forwards registrations gets none itself"
        self.tokenize_manager = TokenizeManager(tokenizer, max_seq_len)
        self.detokenize_manager = DetokenizeManager(tokenizer)
        self.to_detokenizer = to_detokenizer
        self.wait_for_info = wait_for_info
        self.early: Dict[int, List[DetokenizeMsg]] = {}  # uid → 登记之前就到了的 token

    def step(self, msgs: List[BaseTokenizerMsg]) -> Outbox:
        out = Outbox()
        for msg in msgs:  # 按到达顺序：同一个 uid 的登记、token、中止不会颠倒
            if isinstance(msg, DetokenizeMsg):
                if self.wait_for_info and not self.detokenize_manager.knows(msg.uid):
                    self.early.setdefault(msg.uid, []).append(msg)  # 登记还在路上
                else:
                    self._detokenize(msg, out)
            elif isinstance(msg, TokenizeMsg):
                self._tokenize(msg, out)
            elif isinstance(msg, DetokenizeInfoMsg):
                self.detokenize_manager.add_request(msg.uid, msg.prompt_tokens, msg.stop)
                for early in self.early.pop(msg.uid, []):
                    self._detokenize(early, out)
            elif isinstance(msg, AbortMsg):
                if not self.wait_for_info:  # 调度器的中止由分词的进程发：和这个请求的 UserMsg 同一条路，不会抢先
                    out.backend.append(AbortBackendMsg(uid=msg.uid))
                if self.to_detokenizer:  # detokenizer 忘掉状态：和它收到的登记消息也是同一条路
                    out.detokenizer.append(msg)
                else:
                    self.detokenize_manager.abort(msg.uid)
            else:
                raise TypeError(f"a tokenizer process cannot handle {type(msg).__name__}")
        return out

    def _detokenize(self, msg: DetokenizeMsg, out: Outbox) -> None:
        reply = self.detokenize_manager.detokenize(msg)
        if reply is None:
            return
        out.frontend.append(reply)
        if reply.finished and not msg.finished:  # stop 字符串命中：调度器还在生成，让它停下
            out.backend.append(AbortBackendMsg(uid=msg.uid))

    def _tokenize(self, msg: TokenizeMsg, out: Outbox) -> None:
        try:
            user = self.tokenize_manager.tokenize(msg)
        except Exception as e:  # 一个坏请求不能拖垮整个进程：结束它（原因告诉客户端），接着服务别人
            logger.warning(f"request {msg.uid} refused: {e}")
            reply = UserReply(uid=msg.uid, incremental_output="", finished=True, finish_reason="abort", error=str(e))
            out.frontend.append(reply)
            return
        info = DetokenizeInfoMsg(uid=msg.uid, prompt_tokens=len(user.input_ids), stop=list(msg.stop))
        if self.to_detokenizer:
            out.detokenizer.append(info)
        else:
            self.detokenize_manager.add_request(info.uid, info.prompt_tokens, info.stop)
        out.backend.append(user)


def _unwrap(msg: BaseTokenizerMsg) -> List[BaseTokenizerMsg]:
    return msg.data if isinstance(msg, BatchTokenizerMsg) else [msg]


def _batch(msgs: List[Any], batch_cls: type) -> Any:
    return msgs[0] if len(msgs) == 1 else batch_cls(msgs)


def tokenize_worker(*, tokenizer_path: str, addr: str, create: bool, backend_addr: str, frontend_addr: str,
                    local_bs: int = 64, tokenizer_id: int = 0, ack_queue: mp.Queue | None = None,
                    detokenizer_addr: str | None = None, wait_for_info: bool = False,
                    max_seq_len: int | None = None) -> None:
    """一个分词进程的主循环：从 addr 收消息，UserMsg / AbortBackendMsg 发给调度器，UserReply 发给 API Server。

    detokenizer_addr=None：这个进程自己反分词；否则它是单独的 tokenizer，把登记信息和中止请求转到那里。
    wait_for_info：这个进程是有单独 tokenizer 时的 detokenizer，每个请求的 token 都等它的登记（见 TokenizerLoop）。
    local_bs：新请求之外的消息一次至多处理这么多条，处理完就回头看有没有新请求。
    max_seq_len：服务的上下文长度（见 TokenizeManager）。
    """
    watch_parent()  # 启动器被 kill -9 时也跟着退出（第 12 章）
    torch.set_num_threads(1)  # 分词不用 torch 算什么：别让它的线程和调度器抢核
    if local_bs < 1:
        raise ValueError(f"local_bs must be >= 1, got {local_bs}")
    recv: ZmqPullQueue[BaseTokenizerMsg] = ZmqPullQueue(addr, create=create)
    send_backend: ZmqPushQueue[BaseBackendMsg] = ZmqPushQueue(backend_addr, create=False)
    send_frontend: ZmqPushQueue[BaseFrontendMsg] = ZmqPushQueue(frontend_addr, create=False)
    send_detokenizer = None if detokenizer_addr is None else ZmqPushQueue(detokenizer_addr, create=False)
    loop = TokenizerLoop(load_tokenizer(tokenizer_path), to_detokenizer=send_detokenizer is not None,
                         wait_for_info=wait_for_info, max_seq_len=max_seq_len)
    role = "tokenizer" if send_detokenizer is not None else "detokenizer"
    if ack_queue is not None:
        ack_queue.put(f"Tokenizer {tokenizer_id} ({role}) is ready")
    def flush(out: Outbox) -> None:
        if out.detokenizer:  # 先登记，再让调度器开始生成
            assert send_detokenizer is not None
            send_detokenizer.put(_batch(out.detokenizer, BatchTokenizerMsg))
        if out.backend:
            send_backend.put(_batch(out.backend, BatchBackendMsg))
        if out.frontend:
            send_frontend.put(_batch(out.frontend, BatchFrontendMsg))

    backlog: Deque[BaseTokenizerMsg] = deque()  # 已经到了、还没处理的其余消息，按到达顺序
    try:
        while True:
            arrived = [] if backlog else _unwrap(recv.get())  # 手上没活时才阻塞着等
            while not recv.empty():  # 已经到了的全部取走
                arrived += _unwrap(recv.get())
            new = [m for m in arrived if isinstance(m, TokenizeMsg)]
            if new:  # 新请求插队：先分词、先发给调度器
                flush(loop.step(new))
            backlog.extend(m for m in arrived if not isinstance(m, TokenizeMsg))
            if backlog:  # 其余的至多 local_bs 条，做完回到上面，看看这期间有没有来新请求
                flush(loop.step([backlog.popleft() for _ in range(min(local_bs, len(backlog)))]))
    except KeyboardInterrupt:
        pass
    finally:
        for q in (recv, send_backend, send_frontend, send_detokenizer):
            if q is not None:
                q.stop()
