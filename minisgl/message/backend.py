# Tangled from book/chapters/ch12_message_zmq.ipynb — edit the notebook, not this file.
from __future__ import annotations

from dataclasses import dataclass
from typing import List

import torch

from minisgl.core import SamplingParams


@dataclass
class BaseBackendMsg:
    """发给调度器的消息。"""


@dataclass
class UserMsg(BaseBackendMsg):
    """一个新请求：已经分好词的提示词和它的采样参数。"""

    uid: int
    input_ids: torch.Tensor  # [L] int32，CPU
    sampling_params: SamplingParams


@dataclass
class AbortBackendMsg(BaseBackendMsg):
    """停止为 uid 生成，释放它的请求槽和 KV 页（客户端断开，或者命中了 stop 字符串）。"""

    uid: int


@dataclass
class ExitMsg(BaseBackendMsg):
    """让调度器退出主循环。"""


@dataclass
class BatchBackendMsg(BaseBackendMsg):
    data: List[BaseBackendMsg]
