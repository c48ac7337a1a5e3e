"""第 4 章练习：MoE 路由与按专家分组。

把下面每个 `raise NotImplementedError(...)` 换成你的实现。要求见同目录的 README.md。
"""
from __future__ import annotations

import math
from typing import Callable, List, Tuple

Vector = List[float]
Route = List[Tuple[int, float]]  # 一个 token 的 [(专家编号, 权重), ...]，按权重从大到小


def route(logits: List[List[float]], k: int, renormalize: bool) -> List[Route]:
    """每行 softmax，取前 k 个专家（概率降序，相同概率编号小的在前）；renormalize 时这 k 个权重之和为 1。"""
    raise NotImplementedError("实现 route")


def group_by_expert(routes: List[Route], num_experts: int) -> List[List[Tuple[int, int]]]:
    """第 e 项：分到专家 e 的 (token 下标, top-k 位置)，按 token 下标升序。"""
    raise NotImplementedError("实现 group_by_expert")


def moe_forward(xs: List[Vector], logits: List[List[float]], k: int, renormalize: bool,
                experts: List[Callable[[List[Vector]], List[Vector]]]) -> List[Vector]:
    """每个专家最多调用一次，输入是分到它的全部 token；输出按路由权重加权求和回各个 token。"""
    raise NotImplementedError("实现 moe_forward")
