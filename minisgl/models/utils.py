# Tangled from book/chapters/ch03_models.ipynb and ch05_tensor_parallel.ipynb — edit the notebooks, not this file.
from __future__ import annotations

from typing import List, Sequence, Tuple

import torch
import torch.nn.functional as F

from minisgl.distributed import get_tp_info, kv_head_range
from minisgl.layers import (BaseOP, LinearColParallelMerged, LinearQKVMerged, LinearRowParallel, OPList, ParallelLMHead,
                            RMSNorm, RMSNormFused, RotaryEmbedding, VocabParallelEmbedding, get_rope, silu_and_mul)

from .config import ModelConfig

# T = 这次前向的 token 数，S = 缓存里已有的 token 数，E = hidden，I = intermediate，V = 词表
# H/Hkv = q/kv 头数，D = head_dim，L = 层数


class GatedMLP(BaseOP):
    """SwiGLU MLP：down(silu(gate(x)) * up(x))，gate 和 up 合成一个矩阵。"""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        self.gate_up_proj = LinearColParallelMerged(hidden_size, [intermediate_size, intermediate_size])
        self.down_proj = LinearRowParallel(intermediate_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj.forward(silu_and_mul(self.gate_up_proj.forward(x)))  # [T, E] -> [T, 2I] -> [T, E]


class AttentionBlock(BaseOP):
    """qkv_proj → 切成 q、k、v → （q/k norm）→ RoPE → 因果注意力 → o_proj。头数是本 rank 的（TP 下切过）。"""

    def __init__(self, config: ModelConfig, layer_id: int, qk_norm: bool, rotary: RotaryEmbedding) -> None:
        self.layer_id = layer_id
        self.qkv_proj = LinearQKVMerged(config.hidden_size, config.head_dim, config.num_qo_heads, config.num_kv_heads)
        self.num_qo_heads = self.qkv_proj.num_qo_heads  # H/tp
        self.num_kv_heads = self.qkv_proj.num_kv_heads  # Hkv/tp，或者复制时的 1
        self.head_dim = config.head_dim
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if qk_norm else None
        self._rotary = rotary  # 整个模型共用一个（下划线：只是引用）
        self.o_proj = LinearRowParallel(config.num_qo_heads * config.head_dim, config.hidden_size)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, kv_cache: SimpleKVCache) -> torch.Tensor:
        H, Hkv, D = self.num_qo_heads, self.num_kv_heads, self.head_dim
        q, k, v = self.qkv_proj.forward(x).split([H * D, Hkv * D, Hkv * D], dim=-1)
        q, k, v = q.view(-1, H, D), k.view(-1, Hkv, D), v.view(-1, Hkv, D)  # [T, H, D], [T, Hkv, D] ×2
        if self.q_norm is not None and self.k_norm is not None:  # Qwen3：每个头各自归一化
            q, k = self.q_norm.forward(q), self.k_norm.forward(k)
        q, k = self._rotary.forward(positions, q, k)
        o = attention(q, k, v, positions, self.layer_id, kv_cache)  # [T, H, D]
        return self.o_proj.forward(o.reshape(-1, H * D))  # [T, E]，o_proj 里 all-reduce


class SimpleKVCache:
    """一条序列的 KV 缓存：每层一块连续的 K 和 V，位置 p 的 K/V 存在第 p 行；只存本 rank 的 KV 头。"""

    def __init__(self, config: ModelConfig, max_len: int, device: torch.device, dtype: torch.dtype) -> None:
        kv_start, kv_end = kv_head_range(config.num_kv_heads, get_tp_info())
        shape = (config.num_layers, max_len, kv_end - kv_start, config.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)  # [L, max_len, Hkv/tp, D]
        self.v = torch.zeros(shape, device=device, dtype=dtype)  # [L, max_len, Hkv/tp, D]


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, layer_id: int,
              kv_cache: SimpleKVCache) -> torch.Tensor:
    """一条序列的因果注意力：先把这批 K/V 写进缓存第 positions 行，每个 q 再看缓存里位置不超过自己的 K/V。

    q: [T, H, D]，k/v: [T, Hkv, D]，positions: [T] 连续递增 → [T, H, D]。第 6 章换成分页 KV 池 + 注意力后端。
    """
    kv_cache.k[layer_id, positions] = k
    kv_cache.v[layer_id, positions] = v
    seq_len = int(positions[-1]) + 1  # 缓存里到这批最后一个 token 为止的长度
    group = q.shape[1] // k.shape[1]  # GQA：每个 kv 头配 group 个 q 头
    keys = kv_cache.k[layer_id, :seq_len].repeat_interleave(group, dim=1)  # [S, H, D]
    values = kv_cache.v[layer_id, :seq_len].repeat_interleave(group, dim=1)  # [S, H, D]
    causal = torch.arange(seq_len, device=q.device)[None, :] <= positions[:, None]  # [T, S]
    out = F.scaled_dot_product_attention(q.transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1),
                                         attn_mask=causal)  # [H, T, D]
    return out.transpose(0, 1)  # [T, H, D]


class DecoderLayer(BaseOP):
    """pre-norm 解码器层：h = x + attn(norm(x))，out = h + mlp(norm(h))；残差加法并进下一个 norm。"""

    def __init__(self, config: ModelConfig, layer_id: int, mlp: BaseOP, qk_norm: bool,
                 rotary: RotaryEmbedding) -> None:
        self.self_attn = AttentionBlock(config, layer_id, qk_norm, rotary)
        self.mlp = mlp
        self.input_layernorm = RMSNormFused(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNormFused(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor,
                kv_cache: SimpleKVCache) -> Tuple[torch.Tensor, torch.Tensor]:
        x, residual = self.input_layernorm.forward(x, residual)  # residual = 上一层的输出（含残差）
        x = self.self_attn.forward(x, positions, kv_cache)
        x, residual = self.post_attention_layernorm.forward(x, residual)
        return self.mlp.forward(x), residual  # MLP 的输出还没加残差：交给下一层的第一个 norm


class DecoderModel(BaseOP):
    """词嵌入 → 各解码器层 → 最后的 norm；参数名就是 HF 检查点里 "model." 之后的部分。"""

    def __init__(self, config: ModelConfig, layers: List[DecoderLayer]) -> None:
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = OPList(layers)
        self.norm = RMSNormFused(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_cache: SimpleKVCache) -> torch.Tensor:
        x = self.embed_tokens.forward(input_ids)  # [T, E]
        residual: torch.Tensor | None = None
        for layer in self.layers:
            x, residual = layer.forward(x, residual, positions, kv_cache)
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

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_cache: SimpleKVCache) -> torch.Tensor:
        """input_ids、positions：[T] 整数张量，和模型在同一设备 → 最后一个 token 的 logits：[1, V]，模型的 dtype。"""
        hidden = self.model.forward(input_ids, positions, kv_cache)  # [T, E]
        return self.lm_head.forward(hidden[-1:])  # [1, V]：只有最后一个位置要采样


@torch.inference_mode()
def greedy_generate(model: BaseLLMModel, prompt_ids: List[int], max_new_tokens: int,
                    stop_token_ids: Sequence[int] = ()) -> List[int]:
    """贪心解码一条序列，返回新生成的 token（生成了停止 token 就停下，它也在结果里）。"""
    if not prompt_ids:
        raise ValueError("prompt_ids is empty: the model needs at least one token to start from")
    weight = model.model.embed_tokens.weight  # 缓存跟模型在同一设备、同一 dtype
    kv_cache = SimpleKVCache(model.config, len(prompt_ids) + max_new_tokens, weight.device, weight.dtype)
    input_ids = torch.tensor(prompt_ids, dtype=torch.long, device=weight.device)  # [T]
    positions = torch.arange(len(prompt_ids), device=weight.device)  # [T]
    output: List[int] = []
    for _ in range(max_new_tokens):
        logits = model.forward(input_ids, positions, kv_cache)  # [1, V]：最后一个 token 的
        next_id = int(logits[0].argmax())
        output.append(next_id)
        if next_id in stop_token_ids:
            break
        input_ids = torch.tensor([next_id], dtype=torch.long, device=weight.device)  # [1]
        positions = positions[-1:] + 1  # [1]
    return output
