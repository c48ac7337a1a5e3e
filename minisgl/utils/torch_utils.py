# Tangled from book/chapters/ch01_skeleton.ipynb — edit the notebook, not this file.
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@contextmanager
def torch_dtype(dtype: torch.dtype) -> Iterator[None]:
    """在 with 块里把 torch 的默认 dtype 换成 dtype（建模型时用），退出时恢复。"""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def parse_dtype(name: str) -> torch.dtype:
    if name not in _DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose one of {sorted(_DTYPES)}")
    return _DTYPES[name]


def pick_device(name: str = "auto") -> torch.device:
    """auto：有 CUDA 用 cuda，否则 cpu。"""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} was asked for, but this machine has no CUDA GPU")
    return device
