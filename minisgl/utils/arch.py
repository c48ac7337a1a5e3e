# Tangled from book/chapters/ch01_skeleton.ipynb — edit the notebook, not this file.
from __future__ import annotations

from typing import Tuple

import torch


def cuda_capability(device: torch.device) -> Tuple[int, int] | None:
    """GPU 的计算能力（H100/H200 是 (9, 0)）；CPU 上返回 None。"""
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_capability(device)


def is_sm90_supported(device: torch.device) -> bool:
    cap = cuda_capability(device)
    return cap is not None and cap >= (9, 0)


def is_sm100_supported(device: torch.device) -> bool:
    cap = cuda_capability(device)
    return cap is not None and cap >= (10, 0)
