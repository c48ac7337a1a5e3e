# Tangled from book/chapters/ch08_engine.ipynb — edit the notebook, not this file.
from __future__ import annotations

from dataclasses import dataclass
from typing import List

import torch

from minisgl.core import Req

# B = 请求数，V = 词表

_MASK32 = 0xFFFFFFFF


def top_k_top_p_filter(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """logits: [B, V] float32；top_k: [B] int64（V 表示不截断）；top_p: [B] float32。被截掉的位置设为 -inf。

    先 top-k，再在剩下的 token 上按重新归一化的概率做 top-p（与 transformers、vLLM、SGLang 的顺序相同）。
    """
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # [B, V]
    rank = torch.arange(logits.shape[-1], device=logits.device)[None, :]  # [1, V]
    sorted_logits = sorted_logits.masked_fill(rank >= top_k[:, None], float("-inf"))
    probs = sorted_logits.softmax(dim=-1)  # [B, V]：top-k 之后重新归一化
    before = probs.cumsum(dim=-1) - probs  # 排在它前面的概率之和
    sorted_logits = sorted_logits.masked_fill(before > top_p[:, None], float("-inf"))  # 第一个永远保留
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """32 位整数哈希（在 int64 里算：x < 2^32、乘数 < 2^31，乘积不会溢出）。"""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x2C1B3C6D) & _MASK32
    return x ^ (x >> 16)


def gumbel_noise(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """seeds、positions: [B] int64 → [B, V] float32 的 Gumbel 噪声，只由 (seed, position, 词) 决定。"""
    row = _mix32((seeds & _MASK32) ^ _mix32(((seeds >> 32) & _MASK32) ^ _mix32(positions & _MASK32)))  # [B]
    vocab = torch.arange(vocab_size, device=seeds.device, dtype=torch.int64)  # [V]
    x = _mix32((row[:, None] + vocab[None, :] * 0x9E3779B9) & _MASK32)  # [B, V]
    u = ((x >> 8).float() + 0.5) / (1 << 24)  # (0, 1) 内的均匀分布，24 位精度
    return -torch.log(-torch.log(u))


@dataclass
class BatchSamplingArgs:
    """一批请求的采样参数，已经在设备上。全是贪心时只有 greedy=True，其余为 None。"""

    greedy: bool
    is_greedy: torch.Tensor | None = None  # [B] bool
    temperatures: torch.Tensor | None = None  # [B] float32（贪心的行是 1，不参与）
    top_k: torch.Tensor | None = None  # [B] int64
    top_p: torch.Tensor | None = None  # [B] float32
    seeds: torch.Tensor | None = None  # [B] int64
    positions: torch.Tensor | None = None  # [B] int64：要采样的 token 的位置


class Sampler:
    """logits → 下一个 token。没给 seed 的请求用 random_seed 和 uid 派生一个。"""

    def __init__(self, device: torch.device, vocab_size: int, random_seed: int) -> None:
        self.device, self.vocab_size, self.random_seed = device, vocab_size, random_seed

    def prepare(self, reqs: List[Req]) -> BatchSamplingArgs:
        params = [r.sampling_params for r in reqs]
        if all(p.is_greedy for p in params):
            return BatchSamplingArgs(greedy=True)
        V = self.vocab_size
        floats = torch.tensor([[p.temperature if not p.is_greedy else 1.0, p.top_p] for p in params])  # [B, 2]
        ints = torch.tensor([[p.top_k if p.top_k > 0 else V, p.is_greedy, r.device_len,
                              p.seed if p.seed is not None else self._derived_seed(r.uid)]
                             for r, p in zip(reqs, params)], dtype=torch.int64)  # [B, 4]
        floats, ints = floats.to(self.device, non_blocking=True), ints.to(self.device, non_blocking=True)
        return BatchSamplingArgs(greedy=False, is_greedy=ints[:, 1].bool(), temperatures=floats[:, 0],
                                 top_k=ints[:, 0], top_p=floats[:, 1], seeds=ints[:, 3], positions=ints[:, 2])

    def sample(self, logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
        """logits: [B, V] → [B] int32。"""
        greedy = logits.argmax(dim=-1)  # [B]
        if args.greedy:
            return greedy.int()
        assert args.temperatures is not None and args.top_k is not None and args.top_p is not None
        assert args.seeds is not None and args.positions is not None and args.is_greedy is not None
        x = logits.float() / args.temperatures[:, None]  # [B, V]
        x = top_k_top_p_filter(x, args.top_k, args.top_p)
        sampled = (x + gumbel_noise(args.seeds, args.positions, x.shape[-1])).argmax(dim=-1)  # [B]
        return torch.where(args.is_greedy, greedy, sampled).int()

    def _derived_seed(self, uid: int) -> int:
        return ((self.random_seed * 0x9E3779B97F4A7C15) ^ (uid * 0xBF58476D1CE4E5B9)) & (2**62 - 1)
