# Tangled from book/chapters/ch02_layers.ipynb and ch08_engine.ipynb — edit the notebooks, not this file.
from __future__ import annotations

from typing import Tuple

import torch

from .base import BaseOP, fused_kernels


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
    GPU 上（bf16/fp16）用 FlashInfer 的 fused_add_rmsnorm：一个 kernel，原地改写 x 和 residual。
    """

    def __init__(self, size: int, eps: float) -> None:
        self.eps = eps
        self.weight = torch.empty(size)  # [E]

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None
                ) -> Tuple[torch.Tensor, torch.Tensor]:
        fi = fused_kernels(x)
        if fi is not None and residual is not None:
            fi.norm.fused_add_rmsnorm(x, residual, self.weight, self.eps)  # residual += x；x = norm(residual)
            return x, residual
        if residual is not None:
            x = x + residual  # [T, E]
        return _rms_norm(x, self.weight, self.eps), x


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    fi = fused_kernels(x)
    if fi is not None and x.dim() in (2, 3):  # [T, E]，或 q/k norm 的 [T, H, D]（行之间可以有步长）
        return fi.norm.rmsnorm(x, weight, eps)
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)  # [..., E] float32
    return weight * x32.to(x.dtype)
