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
    """API Server → tokenizer：一个新请求的文字（提示词，或者对话消息列表）。"""

    uid: int
    text: str | List[Dict[str, str]]  # 提示词，或 [{"role": ..., "content": ...}, ...]
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
