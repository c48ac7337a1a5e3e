# Tangled from book/chapters/ch03_models.ipynb and ch06_kvcache.ipynb — edit the notebooks, not this file.
from __future__ import annotations

from typing import List, Tuple

import torch

from minisgl.core import get_global_ctx
from minisgl.layers import (AttentionLayer, BaseOP, LinearColParallelMerged, LinearQKVMerged, LinearRowParallel,
                            OPList, ParallelLMHead, RMSNorm, RMSNormFused, RotaryEmbedding,
                            VocabParallelEmbedding, get_rope, silu_and_mul)

from .config import ModelConfig

# T = 这一批的 token 数，B = 请求数，E = hidden，I = intermediate，V = 词表，H/Hkv = q/kv 头数，D = head_dim


class GatedMLP(BaseOP):
    """SwiGLU MLP：down(silu(gate(x)) * up(x))，gate 和 up 合成一个矩阵。"""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        self.gate_up_proj = LinearColParallelMerged(hidden_size, [intermediate_size, intermediate_size])
        self.down_proj = LinearRowParallel(intermediate_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj.forward(silu_and_mul(self.gate_up_proj.forward(x)))  # [T, E] -> [T, 2I] -> [T, E]


class AttentionBlock(BaseOP):
    """qkv_proj → 切成 q、k、v → AttentionLayer（q/k norm、RoPE、后端）→ o_proj。头数是本 rank 的。"""

    def __init__(self, config: ModelConfig, layer_id: int, qk_norm: bool, rotary: RotaryEmbedding) -> None:
        self.qkv_proj = LinearQKVMerged(config.hidden_size, config.head_dim, config.num_qo_heads, config.num_kv_heads)
        H, Hkv, D = self.qkv_proj.num_qo_heads, self.qkv_proj.num_kv_heads, config.head_dim
        self.q_norm = RMSNorm(D, config.rms_norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(D, config.rms_norm_eps) if qk_norm else None
        self.attn = AttentionLayer(layer_id, H, Hkv, D, rotary)
        self.o_proj = LinearRowParallel(config.num_qo_heads * D, config.hidden_size)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        H, Hkv, D = self.attn.num_qo_heads, self.attn.num_kv_heads, self.attn.head_dim
        q, k, v = self.qkv_proj.forward(x).split([H * D, Hkv * D, Hkv * D], dim=-1)
        q, k, v = q.view(-1, H, D), k.view(-1, Hkv, D), v.view(-1, Hkv, D)  # [T, H, D], [T, Hkv, D] ×2
        o = self.attn.forward(q, k, v, positions, self.q_norm, self.k_norm)  # [T, H·D]
        return self.o_proj.forward(o)  # [T, E]，o_proj 里 all-reduce


class DecoderLayer(BaseOP):
    """pre-norm 解码器层：h = x + attn(norm(x))，out = h + mlp(norm(h))；残差加法并进下一个 norm。"""

    def __init__(self, config: ModelConfig, layer_id: int, mlp: BaseOP, qk_norm: bool,
                 rotary: RotaryEmbedding) -> None:
        self.self_attn = AttentionBlock(config, layer_id, qk_norm, rotary)
        self.mlp = mlp
        self.input_layernorm = RMSNormFused(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNormFused(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None,
                positions: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        x, residual = self.input_layernorm.forward(x, residual)
        x = self.self_attn.forward(x, positions)
        x, residual = self.post_attention_layernorm.forward(x, residual)
        return self.mlp.forward(x), residual


class DecoderModel(BaseOP):
    """词嵌入 → 各解码器层 → 最后的 norm；参数名就是 HF 检查点里 "model." 之后的部分。"""

    def __init__(self, config: ModelConfig, layers: List[DecoderLayer]) -> None:
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = OPList(layers)
        self.norm = RMSNormFused(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens.forward(input_ids)  # [T, E]
        residual: torch.Tensor | None = None
        for layer in self.layers:
            x, residual = layer.forward(x, residual, positions)
        return self.norm.forward(x, residual)[0]  # [T, E]


class BaseLLMModel(BaseOP):
    """因果语言模型：model（DecoderModel）+ lm_head。子类用 qk_norm 和 make_mlp 说明自己和 Llama 的不同。"""

    qk_norm: bool = False  # 类属性：不是张量，不算参数

    def __init__(self, config: ModelConfig) -> None:
        self.config = config
        rotary = get_rope(config.head_dim, config.rotary_dim, config.max_position_embeddings, config.rope_theta,
                          config.rope_scaling)  # 所有层共用一张 cos/sin 表
        layers = [DecoderLayer(config, i, self.make_mlp(config, i), self.qk_norm, rotary)
                  for i in range(config.num_layers)]
        self.model = DecoderModel(config, layers)
        tied = self.model.embed_tokens if config.tie_word_embeddings else None
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, config.tie_word_embeddings, tied)

    def make_mlp(self, config: ModelConfig, layer_id: int) -> BaseOP:
        return GatedMLP(config.hidden_size, config.intermediate_size)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids、positions：[T]（Context 里正在运行的批）→ 每个请求下一个 token 的 logits：[B, V]。"""
        hidden = self.model.forward(input_ids, positions)  # [T, E]
        batch = get_global_ctx().batch
        if batch.is_prefill:  # 只有每个请求的最后一个位置要采样
            hidden = hidden[batch.attn_metadata.last_indices]  # [B, E]
        return self.lm_head.forward(hidden)  # [B, V]
