"""第 4 章练习：MoE 路由与按专家分组（参考答案）。"""
from __future__ import annotations

import math
from typing import Callable, List, Tuple

Vector = List[float]
Route = List[Tuple[int, float]]


def route(logits: List[List[float]], k: int, renormalize: bool) -> List[Route]:
    routes = []
    for row in logits:
        if not 1 <= k <= len(row):
            raise ValueError(f"k={k} must be between 1 and the number of experts {len(row)}")
        m = max(row)  # 减去最大值：exp 不会溢出
        exps = [math.exp(v - m) for v in row]
        total = sum(exps)
        probs = [v / total for v in exps]
        top = sorted(range(len(row)), key=lambda e: (-probs[e], e))[:k]
        weights = [probs[e] for e in top]
        if renormalize:
            s = sum(weights)
            weights = [w / s for w in weights]
        routes.append(list(zip(top, weights)))
    return routes


def group_by_expert(routes: List[Route], num_experts: int) -> List[List[Tuple[int, int]]]:
    groups: List[List[Tuple[int, int]]] = [[] for _ in range(num_experts)]
    for t, r in enumerate(routes):  # 按 token 顺序追加，自然就是稳定排序的结果
        for slot, (e, _) in enumerate(r):
            groups[e].append((t, slot))
    return groups


def moe_forward(xs: List[Vector], logits: List[List[float]], k: int, renormalize: bool,
                experts: List[Callable[[List[Vector]], List[Vector]]]) -> List[Vector]:
    routes = route(logits, k, renormalize)
    out = [[0.0] * len(x) for x in xs]
    for e, members in enumerate(group_by_expert(routes, len(experts))):
        if not members:
            continue
        ys = experts[e]([xs[t] for t, _ in members])  # 一个专家一次调用
        for (t, slot), y in zip(members, ys):
            w = routes[t][slot][1]
            out[t] = [o + w * v for o, v in zip(out[t], y)]
    return out
