"""第 2 章练习：旋转位置编码 RoPE。

把下面每个 `raise NotImplementedError(...)` 换成你的实现。要求见同目录的 README.md。
"""
from __future__ import annotations

import math

import torch


def default_inv_freq(rotary_dim: int, base: float) -> torch.Tensor:
    """[rotary_dim // 2] float32：θ_i = 1 / base^(2i / rotary_dim)。"""
    raise NotImplementedError("实现 default_inv_freq")


def llama3_inv_freq(inv_freq: torch.Tensor, factor: float, low_freq_factor: float, high_freq_factor: float,
                    original_max_position: int) -> torch.Tensor:
    """Llama 3.1 的频率缩放：低频除以 factor，高频不变，中频平滑过渡。"""
    raise NotImplementedError("实现 llama3_inv_freq（提示：先算波长 2π/θ）")


def apply_rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """x: [T, N, D]，positions: [T]，inv_freq: [R/2] → 旋转了前 R 维的新张量，形状和 dtype 同 x。"""
    raise NotImplementedError("实现 apply_rope（前一半配后一半，角度 = positions × inv_freq）")
