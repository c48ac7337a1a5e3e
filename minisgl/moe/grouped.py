# Tangled from book/chapters/ch04_moe.ipynb and ch08_engine.ipynb — edit the notebooks, not this file.
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Tuple

import torch
import torch.nn.functional as F

from minisgl.core import get_global_ctx
from minisgl.distributed import all_reduce, get_tp_info, shard_range
from minisgl.layers import BaseOP

# T = 本批 token 数，H = hidden_size，E = 专家数，K = 每个 token 选几个专家，I = 每个专家的中间维


def select_experts(router_logits: torch.Tensor, top_k: int,
                   renormalize: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """路由：在全部专家上 softmax，取概率最大的 top_k 个；renormalize 时让这 k 个权重之和为 1。

    router_logits: [T, E] → (weights [T, K] float32，按概率从大到小；ids [T, K] int64)
    """
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)  # [T, E] float32
    weights, ids = torch.topk(probs, top_k, dim=-1)  # [T, K], [T, K]
    if renormalize:  # Qwen3-MoE 的 norm_topk_prob
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


class BaseMoeBackend(ABC):
    """MoE 的计算后端：给定路由 logits 和一层全部专家的权重，算出这一层的输出（不做 TP 通信）。"""

    supports_cuda_graph: bool = False  # forward 不和 CPU 同步、形状只由 token 数决定：第 8 章能把它录进 CUDA Graph

    @abstractmethod
    def forward(self, x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
                router_logits: torch.Tensor, top_k: int, renormalize: bool) -> torch.Tensor:
        """x: [T, H]；gate_up: [E, 2I, H]；down: [E, H, I]；router_logits: [T, E] → [T, H]，x 的 dtype。"""


def grouped_linear(rows: torch.Tensor, w: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """分组的线性层：rows 的第 ends[e-1] 到 ends[e] 行乘第 e 个专家的 w[e].T。

    rows: [R, in]（按专家排好序），w: [E, out, in]，ends: [E] int32，每段的结束行号（不减）→ [R, out]
    """
    return torch._grouped_mm(rows, w.transpose(1, 2), offs=ends)


class GroupedMoe(BaseMoeBackend):
    """纯 PyTorch：(token, 专家) 对按专家排序，两次分组矩阵乘算完所有专家，再放回 (token, k) 的顺序、加权求和。"""

    def forward(self, x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
                router_logits: torch.Tensor, top_k: int, renormalize: bool) -> torch.Tensor:
        weights, ids = select_experts(router_logits, top_k, renormalize)  # [T, K], [T, K]
        flat_ids = ids.flatten()  # [T*K]：第 t*K+j 个是 token t 的第 j 个专家
        order = torch.argsort(flat_ids, stable=True)  # [T*K]：同一专家的对排在一起
        experts = torch.arange(1, gate_up.shape[0] + 1, device=x.device)  # [E]：1..E
        ends = torch.searchsorted(flat_ids[order], experts).to(torch.int32)  # [E]：编号 < e+1 的有几个
        rows = x[order // top_k]  # [T*K, H]：排好序的第 i 行来自第 order[i] // K 个 token
        gate, up = grouped_linear(rows, gate_up, ends).chunk(2, dim=-1)  # [T*K, I] ×2
        out_rows = grouped_linear(F.silu(gate) * up, down, ends)  # [T*K, H]
        out = torch.empty_like(out_rows).index_copy_(0, order, out_rows)  # 第 i 行放回第 order[i] 行
        out = out.view(-1, top_k, x.shape[-1])  # [T, K, H]
        return (out * weights.unsqueeze(-1).to(x.dtype)).sum(dim=1)  # [T, H]：乘路由权重，沿 k 求和


class MoELayer(BaseOP):
    """一层的全部专家：gate_up_proj [E, 2I/tp, H]、down_proj [E, H, I/tp]。计算交给 Context 里的 MoE 后端。"""

    def __init__(self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int,
                 renormalize: bool) -> None:
        tp = get_tp_info()
        start, end = shard_range(intermediate_size, tp, "moe_intermediate_size")
        self.gate_up_proj = torch.empty(num_experts, 2 * (end - start), hidden_size)  # [E, 2I/tp, H]
        self.down_proj = torch.empty(num_experts, hidden_size, end - start)  # [E, H, I/tp]
        self._top_k = top_k
        self._renormalize = renormalize

    def forward(self, x: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        backend = get_global_ctx().moe_backend
        assert backend is not None, "the engine creates a MoE backend for MoE models"
        y = backend.forward(x, self.gate_up_proj, self.down_proj, router_logits, self._top_k,
                            self._renormalize)  # [T, H]：本 rank 的部分和
        return all_reduce(y)
