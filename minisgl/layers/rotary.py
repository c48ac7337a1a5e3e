# Tangled from book/chapters/ch02_layers.ipynb and ch08_engine.ipynb — edit the notebooks, not this file.
from __future__ import annotations

import math
from typing import Any, Dict, Tuple

import torch

from .base import StateLessOP, fused_kernels

# T = token 数，H/Hkv = q/kv 头数，D = head_dim，R = rotary_dim（通常等于 D）


class RotaryEmbedding(StateLessOP):
    """对 q、k 的前 rotary_dim 维做旋转（前后两半配对，即 Llama/NeoX 的排布），其余维度原样保留。

    位置 [0, max_position) 的 cos/sin 表在构造时算好一次；forward 按 positions 查表。
    """

    def __init__(self, head_dim: int, rotary_dim: int, max_position: int, inv_freq: torch.Tensor,
                 attention_factor: float = 1.0) -> None:
        if rotary_dim % 2 or rotary_dim > head_dim:
            raise ValueError(f"rotary_dim={rotary_dim} must be even and <= head_dim={head_dim}")
        self.head_dim = head_dim
        self.rotary_dim = rotary_dim
        self.max_position = max_position
        # 表建在 CPU 上（模型可能在 meta 设备上构造），第一次前向时搬到 positions 的设备
        pos = torch.arange(max_position, dtype=torch.float32, device="cpu")  # [P]
        freqs = pos[:, None] * inv_freq.float().cpu()[None, :]  # [P, R/2] float32
        # yarn 的 attention_factor 把 cos/sin 整体放大一点；其他方法是 1
        self._cos_sin_cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1) * attention_factor  # [P, R] float32

    def table(self, device: torch.device) -> torch.Tensor:
        """[P, R] float32 的 cos/sin 表，在 device 上：第一次用时搬过去，之后一直留在那里。"""
        if self._cos_sin_cache.device != device:
            self._cos_sin_cache = self._cos_sin_cache.to(device)
        return self._cos_sin_cache

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
                ) -> Tuple[torch.Tensor, torch.Tensor]:
        cos_sin = self.table(positions.device)  # [P, R]
        fi = fused_kernels(q)
        if fi is not None:  # 一个 kernel 原地转完 q 和 k：同一张 [P, R] 表，前一半 cos、后一半 sin
            fi.rope.apply_rope_with_cos_sin_cache_inplace(positions, q, k, self.head_dim, cos_sin, is_neox=True)
            return q, k
        cos, sin = cos_sin[positions].chunk(2, dim=-1)  # [T, R/2] ×2 float32
        cos, sin = cos[:, None, :], sin[:, None, :]  # [T, 1, R/2]
        return _rotate(q, cos, sin), _rotate(k, cos, sin)  # [T, H, D], [T, Hkv, D]


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = cos.shape[-1]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x1, x2, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]  # [T, N, R/2] ×2, [T, N, D-R]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest), dim=-1)  # [T, N, D]


def get_rope(head_dim: int, rotary_dim: int, max_position: int, base: float,
             rope_scaling: Dict[str, Any] | None = None) -> RotaryEmbedding:
    """按 HF config 里的 rope_scaling 构造 RoPE：None/"default"、"llama3" 或 "yarn"。"""
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float32, device="cpu") / rotary_dim  # [R/2]
    inv_freq = 1.0 / (base ** exponents)  # [R/2]
    kind = (rope_scaling or {}).get("rope_type", (rope_scaling or {}).get("type", "default"))
    if kind == "default":
        return RotaryEmbedding(head_dim, rotary_dim, max_position, inv_freq)
    if kind == "llama3":
        return RotaryEmbedding(head_dim, rotary_dim, max_position, _llama3_inv_freq(inv_freq, rope_scaling))
    if kind == "yarn":
        inv_freq, attention_factor = _yarn_inv_freq(rope_scaling, rotary_dim, base, max_position)
        return RotaryEmbedding(head_dim, rotary_dim, max_position, inv_freq, attention_factor)
    raise ValueError(f"unsupported rope_scaling type {kind!r} in {rope_scaling}; supported: default, llama3, yarn")


def _llama3_inv_freq(inv_freq: torch.Tensor, cfg: Dict[str, Any]) -> torch.Tensor:
    """低频（波长 > 原长度/low_freq_factor）除以 factor，高频不动，中间按波长平滑过渡。"""
    factor, low, high = cfg["factor"], cfg["low_freq_factor"], cfg["high_freq_factor"]
    old_len = cfg["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq  # [R/2]
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    mid = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(mid, (1 - smooth) * scaled / factor + smooth * scaled, scaled)


def _yarn_inv_freq(cfg: Dict[str, Any], dim: int, base: float, max_position: int) -> Tuple[torch.Tensor, float]:
    """维度 [low, high] 之间从原频率（外推）线性过渡到 原频率/factor（内插）；另返回 cos/sin 的缩放。"""
    old_len = cfg["original_max_position_embeddings"]
    factor = cfg.get("factor") or max_position / old_len
    scaling = cfg.get("attention_factor")
    if scaling is None:
        mscale, mscale_all_dim = cfg.get("mscale"), cfg.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            scaling = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            scaling = _yarn_mscale(factor)

    def dim_of(rotations: float) -> float:  # 在原长度内恰好转 rotations 圈的那一维
        return dim * math.log(old_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = dim_of(cfg.get("beta_fast") or 32), dim_of(cfg.get("beta_slow") or 1)
    if cfg.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # 避免除以 0
    ramp = ((torch.arange(dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low)).clamp(0, 1)  # [R/2]：0 外推，1 内插
    inv_theta = base ** (torch.arange(0, dim, 2, dtype=torch.float32, device="cpu") / dim)  # [R/2] = 1/θ_i
    # 照 transformers 的写法，不化简成 ramp：浮点里 1-(1-r) 不一定等于 r，逐位对齐要同样的运算顺序
    keep = 1 - ramp  # 保留原频率的比例
    inv_freq = 1.0 / (factor * inv_theta) * (1 - keep) + 1.0 / inv_theta * keep
    return inv_freq, float(scaling)


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0
