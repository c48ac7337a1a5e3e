# Tangled from book/chapters/ch09_continuous_batching.ipynb — edit the notebook, not this file.
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class BaseTokenizerMsg:
    """发给分词 / 反分词进程的消息。"""


@dataclass
class DetokenizeMsg(BaseTokenizerMsg):
    uid: int
    next_token: int
    finished: bool
    finish_reason: str | None = None  # "stop" | "length" | "abort"
