"""第 2 章练习的参考答案：旋转位置编码 RoPE。"""
from __future__ import annotations

import math

import torch


def default_inv_freq(rotary_dim: int, base: float) -> torch.Tensor:
    """[rotary_dim // 2] float32：θ_i = 1 / base^(2i / rotary_dim)。"""
    if rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(f"rotary_dim must be a positive even number, got {rotary_dim}")
    return 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))


def llama3_inv_freq(inv_freq: torch.Tensor, factor: float, low_freq_factor: float, high_freq_factor: float,
                    original_max_position: int) -> torch.Tensor:
    """Llama 3.1 的频率缩放：低频除以 factor，高频不变，中频平滑过渡。"""
    wavelen = 2 * math.pi / inv_freq
    low_wavelen = original_max_position / low_freq_factor  # 比它长的是低频
    high_wavelen = original_max_position / high_freq_factor  # 比它短的是高频
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (original_max_position / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    mid = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(mid, (1 - smooth) * scaled / factor + smooth * scaled, scaled)


def apply_rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """x: [T, N, D]，positions: [T]，inv_freq: [R/2] → 旋转了前 R 维的新张量，形状和 dtype 同 x。"""
    half = inv_freq.shape[0]
    angles = positions.float()[:, None] * inv_freq.float()  # [T, R/2] float32
    cos = angles.cos()[:, None, :].to(x.dtype)  # [T, 1, R/2]
    sin = angles.sin()[:, None, :].to(x.dtype)
    x1, x2, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest), dim=-1)
