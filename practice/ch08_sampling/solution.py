"""第 8 章练习：采样参数、重复惩罚和 CUDA Graph 档位（参考答案）。"""
from __future__ import annotations

import bisect
import math
from typing import List, Optional


def _order(probs: List[float]) -> List[int]:
    """下标按概率从大到小排，并列时下标小的在前。"""
    return sorted(range(len(probs)), key=lambda i: (-probs[i], i))


def _normalize(probs: List[float]) -> List[float]:
    total = sum(probs)
    return [p / total for p in probs]


def sampling_probs(logits: List[float], temperature: float = 1.0, top_k: int = -1,
                   top_p: float = 1.0) -> List[float]:
    """temperature（0 = 贪心 one-hot）→ softmax → top-k → top-p，每次过滤后重新归一化。"""
    if not logits:
        raise ValueError("logits is empty")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k == 0 or top_k < -1:
        raise ValueError(f"top_k must be -1 (off) or >= 1, got {top_k}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if temperature == 0:
        best = max(range(len(logits)), key=lambda i: (logits[i], -i))
        return [1.0 if i == best else 0.0 for i in range(len(logits))]
    m = max(logits)
    probs = _normalize([math.exp((x - m) / temperature) for x in logits])
    if top_k != -1 and top_k < len(probs):
        keep = set(_order(probs)[:top_k])
        probs = _normalize([p if i in keep else 0.0 for i, p in enumerate(probs)])
    if top_p < 1.0:
        keep, mass = set(), 0.0
        for i in _order(probs):
            if probs[i] == 0.0 or mass >= top_p:
                break
            keep.add(i)
            mass += probs[i]
        probs = _normalize([p if i in keep else 0.0 for i, p in enumerate(probs)])
    return probs


def penalize(logits: List[float], prompt_ids: List[int], output_ids: List[int], presence: float = 0.0,
             frequency: float = 0.0, repetition: float = 1.0) -> List[float]:
    """先 repetition（提示词 + 已生成里出现过的词：正的除、负的乘），再 presence/frequency（只数已生成的）。"""
    if repetition <= 0:
        raise ValueError(f"repetition must be > 0, got {repetition}")
    bad = [t for t in prompt_ids + output_ids if not 0 <= t < len(logits)]
    if bad:
        raise ValueError(f"token id {bad[0]} is outside the vocabulary of {len(logits)}")
    out = list(logits)
    for t in set(prompt_ids) | set(output_ids):
        out[t] = out[t] / repetition if out[t] > 0 else out[t] * repetition
    for t in set(output_ids):
        out[t] -= presence + frequency * output_ids.count(t)
    return out


def capture_sizes(max_bs: int) -> List[int]:
    """[1, 2, 4] + 8 的倍数，都不超过 max_bs；max_bs == 0 → []。"""
    if max_bs < 0:
        raise ValueError(f"max_bs must be >= 0, got {max_bs}")
    return [b for b in (1, 2, 4) if b <= max_bs] + list(range(8, max_bs + 1, 8))


def pick_bucket(bs: int, sizes: List[int]) -> Optional[int]:
    """sizes（升序）里不小于 bs 的最小档位；没有 → None（eager）。"""
    if bs < 1:
        raise ValueError(f"bs must be >= 1, got {bs}")
    i = bisect.bisect_left(sizes, bs)
    return sizes[i] if i < len(sizes) else None
