# Tangled from book/chapters/ch02_layers.ipynb and ch05_tensor_parallel.ipynb and ch08_engine.ipynb — edit the notebooks, not this file.
from __future__ import annotations

from typing import List

import torch

from minisgl.distributed import all_reduce, get_tp_info, kv_head_range, shard_range

from .base import BaseOP, linear, onednn_weight


class _Linear(BaseOP):
    """y = x @ weight.T + bias；weight: [out, in]，bias: [out] 或 None。"""

    def __init__(self, input_size: int, output_size: int, bias: bool) -> None:
        self.input_size = input_size
        self.output_size = output_size
        self.weight = torch.empty(output_size, input_size)  # [out, in]
        self.bias = torch.empty(output_size) if bias else None  # [out]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)  # [T, in] -> [T, out]

    def use_onednn(self) -> None:
        """CPU、float32：权重换成 oneDNN 排好的一份（引擎加载权重之后调用，见后面"CPU 上的矩阵乘"一节）。"""
        self.weight = onednn_weight(self.weight)


class LinearReplicated(_Linear):
    """完整的权重，张量并行时每个 rank 各存一份（不切分、不通信）。"""

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        super().__init__(input_size, output_size, bias)


class LinearColParallelMerged(_Linear):
    """几个输入相同的矩阵按输出维拼成一个（如 gate_proj + up_proj）；每段各自按输出维切，本 rank 存每段的一份。"""

    def __init__(self, input_size: int, output_sizes: List[int], bias: bool = False) -> None:
        tp = get_tp_info()
        self.output_sizes = [end - start for start, end in
                             (shard_range(n, tp, "the MLP intermediate_size") for n in output_sizes)]
        super().__init__(input_size, sum(self.output_sizes), bias)  # weight: [Σ out_i/tp, in]


class LinearQKVMerged(_Linear):
    """q、k、v 三个投影拼成一个：[H·D | Hkv·D | Hkv·D]，按头切；num_qo_heads、num_kv_heads 是本 rank 的头数。"""

    def __init__(self, hidden_size: int, head_dim: int, num_qo_heads: int, num_kv_heads: int,
                 bias: bool = False) -> None:
        tp = get_tp_info()
        q_start, q_end = shard_range(num_qo_heads, tp, "num_attention_heads")
        kv_start, kv_end = kv_head_range(num_kv_heads, tp)
        self.head_dim = head_dim
        self.num_qo_heads = q_end - q_start  # H/tp
        self.num_kv_heads = kv_end - kv_start  # Hkv/tp，或者复制时的 1
        super().__init__(hidden_size, (self.num_qo_heads + 2 * self.num_kv_heads) * head_dim, bias)


class LinearRowParallel(_Linear):
    """注意力的 o_proj、MLP 的 down_proj：按输入维切，各 rank 的部分和 all-reduce 后再加偏置。"""

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        what = "the input size of a row-parallel layer (intermediate_size, or num_attention_heads * head_dim)"
        start, end = shard_range(input_size, get_tp_info(), what)
        super().__init__(end - start, output_size, bias)  # weight: [out, in/tp]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = all_reduce(linear(x, self.weight))  # [T, in/tp] -> [T, out]
        return y if self.bias is None else y + self.bias
