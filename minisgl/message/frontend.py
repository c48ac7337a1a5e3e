# Tangled from book/chapters/ch12_message_zmq.ipynb — edit the notebook, not this file.
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List


@dataclass
class BaseFrontendMsg:
    """发给 API Server 的消息。"""


@dataclass
class UserReply(BaseFrontendMsg):
    """detokenizer → API Server：uid 新增的一段文字。"""

    uid: int
    incremental_output: str
    finished: bool
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    prompt_tokens: int = 0  # 最后一条（finished）回复里填上，给 OpenAI 的 usage
    completion_tokens: int = 0
    cached_tokens: int = 0  # 最后一条里填：提示词在前缀缓存里命中的 token 数（usage.prompt_tokens_details）
    logprobs: List[Dict[str, Any]] | None = None  # 要了 logprobs 时：这段文字里每个 token 一项（OpenAI 的形状）
    error: str | None = None  # 请求被拒绝时（提示词太长、max_tokens 太大……）给客户端的说明


@dataclass
class SchedulerStats(BaseFrontendMsg):
    """调度器 rank 0 → API Server：只有调度器知道的数（第 15 章的 /metrics）。三类页之和是 KV 池的总页数。"""

    running: int = 0  # 占着请求槽的请求（prefill 中或 decode 中）
    waiting: int = 0  # 还在排队
    pages_used: int = 0  # 运行中的请求在用的页：它们自己的页，加上它们命中、锁着的前缀缓存页
    pages_cached: int = 0  # 只在前缀缓存里、眼下没有请求在用的页（需要时可以淘汰）
    pages_free: int = 0  # 空闲列表上的页
    cached_tokens: int = 0  # 累计：前缀缓存命中的提示词 token（这些位置不用重新 prefill）


@dataclass
class BatchFrontendMsg(BaseFrontendMsg):
    data: List[BaseFrontendMsg]
