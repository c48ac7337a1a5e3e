# Tangled from book/chapters/ch03_models.ipynb — edit the notebook, not this file.
from __future__ import annotations

from .utils import BaseLLMModel


class Qwen3ForCausalLM(BaseLLMModel):
    """Qwen3 = Llama 的结构 + 注意力里每个头的 q、k 在 RoPE 之前各做一次 RMSNorm。"""

    qk_norm = True
