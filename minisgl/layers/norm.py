# Tangled from book/chapters/ch02_layers.ipynb — edit the notebook, not this file.
from __future__ import annotations

from typing import Tuple

import torch

from .base import BaseOP


class RMSNorm(BaseOP):
    """x / sqrt(mean(x²) + eps) * weight，沿最后一维；在 float32 里算，转回输入 dtype 再乘权重。"""

    def __init__(self, size: int, eps: float) -> None:
        self.eps = eps
        self.weight = torch.empty(size)  # [E]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _rms_norm(x, self.weight, self.eps)


class RMSNormFused(BaseOP):
    """残差加法 + RMSNorm：forward(x, residual) 返回 (norm(x + residual), x + residual)。

    每个解码器层的第一个 norm 拿到的 residual 是 None：这时 x 本身就是新的残差。
    """

    def __init__(self, size: int, eps: float) -> None:
        self.eps = eps
        self.weight = torch.empty(size)  # [E]

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None
                ) -> Tuple[torch.Tensor, torch.Tensor]:
        if residual is not None:
            x = x + residual  # [T, E]
        return _rms_norm(x, self.weight, self.eps), x


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)  # [..., E] float32
    return weight * x32.to(x.dtype)
