# Tangled from book/chapters/ch09_continuous_batching.ipynb — edit the notebook, not this file.
from __future__ import annotations

from dataclasses import dataclass
from typing import Set

import torch

from minisgl.core import SamplingParams


@dataclass
class PendingReq:
    """还在排队、没占用任何资源的请求。"""

    uid: int
    input_ids: torch.Tensor  # [L] int32，CPU
    sampling_params: SamplingParams


def eos_token_ids(model_path) -> Set[int]:
    """结束符：generation_config.json 里的 eos_token_id（可以是一个或一组），没有就看 config.json。"""
    import json
    from pathlib import Path

    ids: Set[int] = set()
    for name in ("generation_config.json", "config.json"):
        f = Path(model_path) / name
        if f.exists():
            value = json.loads(f.read_text()).get("eos_token_id")
            ids.update([value] if isinstance(value, int) else (value or []))
            if ids:
                break
    return ids
