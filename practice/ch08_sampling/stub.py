"""第 8 章练习：采样参数、重复惩罚和 CUDA Graph 档位。

把下面每个 `raise NotImplementedError(...)` 换成你的实现。要求见同目录的 README.md。
"""
from __future__ import annotations

import math
from typing import List, Optional


def sampling_probs(logits: List[float], temperature: float = 1.0, top_k: int = -1,
                   top_p: float = 1.0) -> List[float]:
    """temperature（0 = 贪心 one-hot）→ softmax → top-k → top-p，每次过滤后重新归一化。"""
    raise NotImplementedError("实现 sampling_probs")


def penalize(logits: List[float], prompt_ids: List[int], output_ids: List[int], presence: float = 0.0,
             frequency: float = 0.0, repetition: float = 1.0) -> List[float]:
    """先 repetition（提示词 + 已生成里出现过的词：正的除、负的乘），再 presence/frequency（只数已生成的）。"""
    raise NotImplementedError("实现 penalize")


def capture_sizes(max_bs: int) -> List[int]:
    """[1, 2, 4] + 8 的倍数，都不超过 max_bs；max_bs == 0 → []。"""
    raise NotImplementedError("实现 capture_sizes")


def pick_bucket(bs: int, sizes: List[int]) -> Optional[int]:
    """sizes（升序）里不小于 bs 的最小档位；没有 → None（eager）。"""
    raise NotImplementedError("实现 pick_bucket")
