# Tangled from book/chapters/ch04_moe.ipynb and ch06_kvcache.ipynb — edit the notebooks, not this file.
from __future__ import annotations

from typing import Type

from minisgl.utils import Registry

from .config import ModelConfig
from .llama import LlamaForCausalLM
from .qwen3 import Qwen3ForCausalLM
from .qwen3_moe import Qwen3MoeForCausalLM
from .utils import BaseLLMModel
from .weight import init_dummy_weight, load_weight


MODELS: Registry[Type[BaseLLMModel]] = Registry("model architecture")
MODELS.register("LlamaForCausalLM")(LlamaForCausalLM)
MODELS.register("Qwen3ForCausalLM")(Qwen3ForCausalLM)
MODELS.register("Qwen3MoeForCausalLM")(Qwen3MoeForCausalLM)


def create_model(config: ModelConfig) -> BaseLLMModel:
    """按 config.architecture 构造模型。权重只是占位，放在当前的默认 device、默认 dtype 上；随后 load_weight。"""
    return MODELS.get(config.architecture)(config)


__all__ = ["MODELS", "BaseLLMModel", "ModelConfig", "create_model", "init_dummy_weight", "load_weight"]
