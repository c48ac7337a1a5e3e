# Tangled from book/chapters/ch12_message_zmq.ipynb — edit the notebook, not this file.
from __future__ import annotations

from dataclasses import dataclass
from typing import List


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


@dataclass
class BatchFrontendMsg(BaseFrontendMsg):
    data: List[BaseFrontendMsg]
