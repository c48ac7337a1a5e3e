# Tangled from book/chapters/ch09_continuous_batching.ipynb — edit the notebook, not this file.
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
    uid: int
    input_ids: torch.Tensor  # [L] int32，CPU
    sampling_params: SamplingParams


@dataclass
class AbortBackendMsg(BaseBackendMsg):
    uid: int


@dataclass
class ExitMsg(BaseBackendMsg):
    pass


@dataclass
class BatchBackendMsg(BaseBackendMsg):
    data: List[BaseBackendMsg]
