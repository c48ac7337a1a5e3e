# Tangled from book/chapters/ch02_layers.ipynb and ch08_engine.ipynb — edit the notebooks, not this file.
from __future__ import annotations

import functools
from types import ModuleType
from typing import Any, Dict, Generic, Iterator, List, Tuple, TypeVar

import torch
import torch.nn.functional as F

from minisgl.env import load_env
from minisgl.kernel import gemv, gemv_supported

StateDict = Dict[str, torch.Tensor]


class BaseOP:
    """推理用的最小"模块"：公开属性里的张量是参数，BaseOP 是子算子；名字用点号连接。"""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.forward")

    def children(self) -> Iterator[Tuple[str, torch.Tensor | BaseOP]]:
        """直接成员：(属性名, 张量或子算子)。下划线开头的属性和其他类型（int、None……）都不算。"""
        for name, value in vars(self).items():
            if not name.startswith("_") and isinstance(value, (torch.Tensor, BaseOP)):
                yield name, value

    def state_dict(self, prefix: str = "") -> StateDict:
        return {name: getattr(owner, attr) for name, owner, attr in self._slots(prefix)}

    def load_state_dict(self, state: StateDict, prefix: str = "") -> None:
        """按名字换上 state 里的张量（转成占位张量的 dtype 和 device）。名字或形状对不上就报错，什么都不改。"""
        slots = list(self._slots(prefix))
        expected = {name for name, _, _ in slots}
        missing = sorted(expected - state.keys())
        unexpected = sorted(k for k in state if (k.startswith(prefix + ".") if prefix else True) and k not in expected)
        if missing or unexpected:
            raise KeyError(f"state_dict does not match {type(self).__name__}: missing {missing}, "
                           f"unexpected {unexpected}")
        for name, owner, attr in slots:
            old, new = getattr(owner, attr), state[name]
            if old.shape != new.shape:
                raise ValueError(f"{name}: the state_dict has shape {tuple(new.shape)}, "
                                 f"the model expects {tuple(old.shape)}")
        for name, owner, attr in slots:
            old = getattr(owner, attr)
            setattr(owner, attr, state[name].to(device=old.device, dtype=old.dtype))

    def _slots(self, prefix: str) -> Iterator[Tuple[str, BaseOP, str]]:
        """递归列出每个参数：(全名, 持有它的算子, 属性名)。"""
        for attr, value in self.children():
            name = f"{prefix}.{attr}" if prefix else attr
            if isinstance(value, torch.Tensor):
                yield name, self, attr
            else:
                yield from value._slots(name)


class StateLessOP(BaseOP):
    """没有参数的算子（比如 RoPE）：它的公开张量属性也不算参数。"""

    def children(self) -> Iterator[Tuple[str, torch.Tensor | BaseOP]]:
        return iter(())


T = TypeVar("T", bound=BaseOP)


class OPList(BaseOP, Generic[T]):
    """算子列表；第 i 个的参数名以 "i." 开头，和 nn.ModuleList 一样。"""

    def __init__(self, ops: List[T]) -> None:
        self.op_list = ops

    def children(self) -> Iterator[Tuple[str, torch.Tensor | BaseOP]]:
        for i, op in enumerate(self.op_list):
            yield str(i), op

    def __iter__(self) -> Iterator[T]:
        return iter(self.op_list)

    def __len__(self) -> int:
        return len(self.op_list)

    def __getitem__(self, i: int) -> T:
        return self.op_list[i]


@functools.cache
def _fused_module() -> ModuleType | None:
    """FlashInfer 模块；没装、或 MINISGL_FUSED_KERNELS=0 时是 None。每个进程只判断一次（每层都要问它）。"""
    if not load_env().fused_kernels:
        return None
    try:
        import flashinfer

        return flashinfer
    except ImportError:
        return None


def fused_kernels(x: torch.Tensor) -> ModuleType | None:
    """x 在 GPU 上、是 bf16/fp16、FlashInfer 可用：返回 flashinfer 模块，用它的融合 kernel；否则 None。"""
    if not x.is_cuda or x.dtype not in (torch.bfloat16, torch.float16):
        return None
    return _fused_module()


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T (+ bias)：[T, in] -> [T, out]。权重是 oneDNN 排好的那种时用 oneDNN（CPU）；
    GPU 上 bf16/fp16、T <= 16 时用 Triton 的 GEMV；否则 F.linear。"""
    if weight.is_mkldnn:  # 引擎在 CPU 上换的（onednn_weight，见后面"CPU 上的矩阵乘"一节）
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    if fused_kernels(x) is not None and gemv_supported(x, weight):
        return gemv(x, weight, bias)
    return F.linear(x, weight, bias)


def onednn_weight(weight: torch.Tensor) -> torch.Tensor:
    """CPU 上 float32 的权重 [out, in] → oneDNN 为矩阵乘排好的一份（layout 是 torch._mkldnn，linear 认得它）。
    形状和 dtype 不变，数据按 oneDNN 的内核读取的顺序分块重排：只能交给 linear，不能再当普通张量读写。"""
    assert weight.device.type == "cpu" and weight.dtype == torch.float32 and weight.dim() == 2, weight.shape
    return torch.ops.mkldnn._reorder_linear_weight(weight)
