# Tangled from book/chapters/ch08_engine.ipynb — edit the notebook, not this file.
from __future__ import annotations

import torch

from minisgl.layers import BaseOP, LinearReplicated
from minisgl.moe import MoELayer

from .config import ModelConfig
from .utils import BaseLLMModel


class SparseMoeBlock(BaseOP):
    """路由器 gate（[E, H] 的线性层）+ 全部专家；参数名与 HF 的 mlp.gate、mlp.experts 对应。"""

    def __init__(self, config: ModelConfig) -> None:
        self.gate = LinearReplicated(config.hidden_size, config.num_experts)
        self.experts = MoELayer(config.num_experts, config.num_experts_per_tok, config.hidden_size,
                                config.moe_intermediate_size, config.norm_topk_prob)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.experts.forward(x, self.gate.forward(x))  # [T, H] → router [T, E] → [T, H]


class Qwen3MoeForCausalLM(BaseLLMModel):
    """Qwen3 的注意力（带 q/k norm）+ 每层一个稀疏 MoE 块。"""

    qk_norm = True

    def __init__(self, config: ModelConfig) -> None:
        if not config.is_moe:
            raise ValueError(f"{config.architecture}: config.json has no num_experts; is it a MoE checkpoint?")
        super().__init__(config)

    def make_mlp(self, config: ModelConfig, layer_id: int) -> BaseOP:
        return SparseMoeBlock(config)
