# Tangled from book/chapters/ch04_moe.ipynb — edit the notebook, not this file.
from __future__ import annotations

from typing import Callable

from minisgl.utils import Registry

from .grouped import BaseMoeBackend, GroupedMoe, MoELayer, select_experts

MoeBackendFactory = Callable[[], BaseMoeBackend]
MOE_BACKENDS: Registry[MoeBackendFactory] = Registry("MoE backend")


@MOE_BACKENDS.register("torch")
def _torch() -> BaseMoeBackend:
    return GroupedMoe()


def create_moe_backend(name: str) -> BaseMoeBackend:
    """按名字创建 MoE 后端；不认识的名字报 ValueError 并列出可选项。"""
    return MOE_BACKENDS.get(name)()


__all__ = ["BaseMoeBackend", "GroupedMoe", "MOE_BACKENDS", "MoELayer", "create_moe_backend", "select_experts"]
