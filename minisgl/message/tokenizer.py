# Tangled from book/chapters/ch12_message_zmq.ipynb — edit the notebook, not this file.
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List

from minisgl.core import SamplingParams


@dataclass
class BaseTokenizerMsg:
    """发给 tokenizer / detokenizer 进程的消息。"""


@dataclass
class TokenizeMsg(BaseTokenizerMsg):
    """API Server → tokenizer：一个新请求的文字（提示词，或者对话消息列表），或者已经分好词的 token id。"""

    uid: int
    text: str | List[Dict[str, str]] | List[int]  # 提示词；[{"role": ..., "content": ...}, ...]；或 token id
    sampling_params: SamplingParams
    chat_options: Dict[str, Any] = field(default_factory=dict)  # 传给对话模板，例如 enable_thinking
    stop: List[str] = field(default_factory=list)  # OpenAI 的 stop 字符串：输出在它之前截断


@dataclass
class DetokenizeMsg(BaseTokenizerMsg):
    """调度器 → detokenizer：uid 刚生成的一个 token。"""

    uid: int
    next_token: int
    finished: bool
    finish_reason: str | None = None  # finished 时："stop"（EOS 或 stop token）| "length" | "abort"（不带 token）
    cached_tokens: int = 0  # 请求的第一个 token 上填：提示词里有多少个 token 是在前缀缓存里找到的
    logprob: float | None = None  # 请求要了 logprobs 时：next_token 在模型分布里的对数概率
    top_ids: List[int] | None = None  # 要了 top_logprobs 时：最可能的几个 token（按概率从大到小）
    top_logprobs: List[float] | None = None  # 和 top_ids 一一对应的对数概率


@dataclass
class AbortMsg(BaseTokenizerMsg):
    """API Server → tokenizer：客户端走了，中止 uid。"""

    uid: int


@dataclass
class DetokenizeInfoMsg(BaseTokenizerMsg):
    """tokenizer → detokenizer（两者是不同进程时）：detokenizer 需要知道、却只有 tokenizer 知道的事。"""

    uid: int
    prompt_tokens: int
    stop: List[str] = field(default_factory=list)


@dataclass
class BatchTokenizerMsg(BaseTokenizerMsg):
    data: List[BaseTokenizerMsg]
