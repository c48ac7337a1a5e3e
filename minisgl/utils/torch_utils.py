# Tangled from book/chapters/ch01_skeleton.ipynb — edit the notebook, not this file.
from __future__ import annotations

import os
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
    try:
        device = torch.device(name)
    except RuntimeError:  # torch 的报错列出它认识的几十种设备，不说是哪个参数错了
        raise ValueError(f"--device {name!r} is invalid: use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} was asked for, but this machine has no CUDA GPU")
    return device


def cpu_cores() -> int:
    """这个进程能用的 CPU 核数（taskset 和容器的限制都算在内）。"""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS 没有 sched_getaffinity
        return os.cpu_count() or 1


def set_num_threads(n: int | None = None, share: int = 1) -> int:
    """给本进程的 torch 定一个线程数，返回它：n；没给就用 OMP_NUM_THREADS；都没有就是核数 / share。

    share：有几个进程要分这些核（TP 的每个 rank 一份）。torch 默认每个进程都开核数个线程。
    """
    if n is None:
        env = os.environ.get("OMP_NUM_THREADS", "")
        n = int(env) if env.isdigit() and int(env) > 0 else max(1, cpu_cores() // share)
    if n < 1:
        raise ValueError(f"num_threads={n} is invalid: it must be >= 1")
    torch.set_num_threads(n)
    return n
