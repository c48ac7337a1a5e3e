# Tangled from book/chapters/ch09_continuous_batching.ipynb — edit the notebook, not this file.
from __future__ import annotations

from dataclasses import dataclass
from typing import Set

import torch

from minisgl.core import Req, SamplingParams


@dataclass
class PendingReq:
    """还在排队、没占用任何资源的请求。被撤回的请求也回到这里：input_ids 的最后 num_outputs 个 token 是它已经
    生成、已经发出去的。"""

    uid: int
    input_ids: torch.Tensor  # [L] int32，CPU
    sampling_params: SamplingParams  # max_tokens 已经由 add_request 定成整数
    num_outputs: int = 0
    waited: int = 0  # 为了等共享前缀的请求先插进缓存，已经让过几步
    retracted: bool = False  # 被撤回过：再接纳时命中的是它自己刚放回缓存的页，不算进 hit_tokens

    @property
    def final_len(self) -> int:
        """最长能到多少 token：提示词 + max_tokens。"""
        return len(self.input_ids) - self.num_outputs + self.sampling_params.max_tokens


def num_outputs(req: Req) -> int:
    """一个 Req 已经生成了多少 token：input_ids 超出提示词的部分（提示词长 = max_device_len - output_len）。"""
    return len(req.input_ids) - (req.max_device_len - req.output_len)


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
