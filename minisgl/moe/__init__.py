# Tangled from book/chapters/ch04_moe.ipynb — edit the notebook, not this file.
from __future__ import annotations

from typing import Callable

import torch

from minisgl.utils import Registry

from .fused import TritonMoe, fused_moe, fused_moe_available
from .grouped import BaseMoeBackend, GroupedMoe, MoELayer, grouped_linear, select_experts

MoeBackendFactory = Callable[[], BaseMoeBackend]
MOE_BACKENDS: Registry[MoeBackendFactory] = Registry("MoE backend")


@MOE_BACKENDS.register("torch")
def _torch() -> BaseMoeBackend:
    return GroupedMoe()


@MOE_BACKENDS.register("triton")
def _triton() -> BaseMoeBackend:
    return TritonMoe()


def create_moe_backend(name: str) -> BaseMoeBackend:
    """按名字创建 MoE 后端；不认识的名字报 ValueError 并列出可选项。"""
    return MOE_BACKENDS.get(name)()


def resolve_moe_backend(name: str, device: torch.device) -> str:
    """auto：GPU 上装了 Triton 时是 triton，否则 torch；其他名字原样返回（create_moe_backend 再检查）。"""
    if name != "auto":
        return name
    return "triton" if device.type == "cuda" and fused_moe_available() else "torch"


__all__ = ["BaseMoeBackend", "GroupedMoe", "MOE_BACKENDS", "MoELayer", "TritonMoe", "create_moe_backend",
           "fused_moe", "fused_moe_available", "grouped_linear", "resolve_moe_backend", "select_experts"]
