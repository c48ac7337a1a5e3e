# Tangled from book/chapters/ch03_models.ipynb — edit the notebook, not this file.
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Tuple


@dataclass(frozen=True)
class ModelConfig:
    """模型结构：从 HF config 读出、推理用得到的字段。"""

    architecture: str  # HF 的类名，如 "LlamaForCausalLM"，用来在 MODELS 里找模型类
    model_type: str  # "llama"、"qwen3"……
    num_layers: int
    hidden_size: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    rotary_dim: int  # RoPE 旋转的维数：head_dim × partial_rotary_factor；我们支持的结构都是整个 head_dim
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: Dict[str, Any] | None  # None 表示 default RoPE；否则是 llama3/yarn 的参数
    max_position_embeddings: int
    tie_word_embeddings: bool
    # MoE（第 4 章）：稠密模型全是 0 / False
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @classmethod
    def from_hf(cls, hf: Any) -> ModelConfig:
        """hf：transformers 的 PretrainedConfig（load_hf_config(path) 的返回值）。"""
        for name, bad in (("hidden_act", lambda v: v != "silu"), ("attention_bias", bool), ("mlp_bias", bool)):
            value = getattr(hf, name, None)
            if value is not None and bad(value):
                raise ValueError(f"config.json has {name}={value!r}; minisgl supports silu MLPs without biases")
        if not getattr(hf, "architectures", None):
            raise ValueError("config.json has no 'architectures': cannot tell which model class to build")
        if getattr(hf, "mlp_only_layers", None) or getattr(hf, "decoder_sparse_step", 1) != 1:
            raise ValueError(f"config.json has mlp_only_layers={getattr(hf, 'mlp_only_layers', None)} and "
                             f"decoder_sparse_step={getattr(hf, 'decoder_sparse_step', 1)}; minisgl supports MoE "
                             "models whose every layer is MoE")
        theta, scaling, partial_rotary_factor = _rope_params(hf)
        if partial_rotary_factor != 1.0:  # transformers 的 Llama/Qwen3 不旋转部分维度：没有可以对齐的参照
            raise ValueError(f"config.json has partial_rotary_factor={partial_rotary_factor}; the Llama and Qwen3 "
                             "architectures rotate the whole head_dim, so minisgl supports only 1.0")
        head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
        return cls(
            architecture=hf.architectures[0],
            model_type=hf.model_type,
            num_layers=hf.num_hidden_layers,
            hidden_size=hf.hidden_size,
            num_qo_heads=hf.num_attention_heads,
            num_kv_heads=getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads,
            head_dim=head_dim,
            rotary_dim=head_dim,
            intermediate_size=hf.intermediate_size,
            vocab_size=hf.vocab_size,
            rms_norm_eps=hf.rms_norm_eps,
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=hf.max_position_embeddings,
            tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
            num_experts=getattr(hf, "num_experts", 0) or 0,
            num_experts_per_tok=getattr(hf, "num_experts_per_tok", 0) or 0,
            moe_intermediate_size=getattr(hf, "moe_intermediate_size", 0) or 0,
            norm_topk_prob=bool(getattr(hf, "norm_topk_prob", False)),
        )


def _rope_params(hf: Any) -> Tuple[float, Dict[str, Any] | None, float]:
    """(rope_theta, rope_scaling, partial_rotary_factor)。transformers 5 把它们放在 rope_parameters 里，4.x 各是一个字段。"""
    params = dict(getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", None) or {})
    theta = params.pop("rope_theta", None) or getattr(hf, "rope_theta", None) or 10000.0
    partial = params.pop("partial_rotary_factor", None) or getattr(hf, "partial_rotary_factor", None) or 1.0
    kind = params.get("rope_type", params.get("type", "default"))
    return float(theta), (params if kind != "default" else None), float(partial)
