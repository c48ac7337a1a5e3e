# Tangled from book/chapters/ch03_models.ipynb — edit the notebook, not this file.
from __future__ import annotations

from .utils import BaseLLMModel


class LlamaForCausalLM(BaseLLMModel):
    """Llama（SmolLM2 也是这个结构）：pre-norm、GQA、RoPE、SwiGLU——公共骨架原样使用。"""
