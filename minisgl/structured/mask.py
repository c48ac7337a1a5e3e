# Tangled from book/chapters/ch17_structured.ipynb — edit the notebook, not this file.
from __future__ import annotations

import torch

from minisgl.utils import div_ceil

# B = 请求数，V = 模型的词表大小（可能比分词器的大），W = ceil(V / 32)：一个 int32 管 32 个 token


def allocate_vocab_mask(batch_size: int, vocab_size: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[B, W] int32，全是 -1（32 位全是 1）：每一行都允许所有 token。"""
    return torch.full((batch_size, div_ceil(vocab_size, 32)), -1, dtype=torch.int32, device=device)


def unpack_vocab_mask(mask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[B, W] int32 → [B, V] bool：token j 是第 j // 32 个字的第 j % 32 位（低位在前）。"""
    shifts = torch.arange(32, dtype=torch.int32, device=mask.device)  # [32]
    bits = (mask.unsqueeze(-1) >> shifts) & 1  # [B, W, 32]：算术右移，& 1 只留最低位
    return bits.flatten(1)[:, :vocab_size].bool()  # [B, V]


def apply_vocab_mask(logits: torch.Tensor, mask: torch.Tensor) -> None:
    """原地：logits [B, V] 里掩码为 0 的位置改成 -inf。mask [B, W] int32，和 logits 在同一个设备上。"""
    allowed = unpack_vocab_mask(mask, logits.shape[-1])  # [B, V]
    logits.masked_fill_(~allowed, float("-inf"))
