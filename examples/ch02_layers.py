# Tangled from book/chapters/ch02_layers.ipynb — edit the notebook, not this file.
"""第 2 章：minisgl.layers 的每个算子都和 transformers 里对应的代码逐元素相等（float32，随机输入）。"""

import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb

from minisgl.distributed import set_tp_info
from minisgl.layers import (LinearColParallelMerged, LinearRowParallel, OPList, RMSNorm, RMSNormFused, get_rope,
                            silu_and_mul)

set_tp_info(0, 1)  # 单进程：rank 0 / 共 1 个
torch.manual_seed(0)
diffs = {}  # 每个算子与 transformers 的最大误差
T, E, I = 7, 64, 160  # token 数、hidden、intermediate
x, residual = torch.randn(T, E), torch.randn(T, E)

# RMSNorm 与融合版
hf_norm = LlamaRMSNorm(E, eps=1e-6)
hf_norm.weight.data.normal_()
norm, fused = RMSNorm(E, 1e-6), RMSNormFused(E, 1e-6)
norm.load_state_dict(dict(hf_norm.state_dict()))
fused.load_state_dict(dict(hf_norm.state_dict()))
y, new_residual = fused.forward(x, residual)
with torch.no_grad():
    diffs["RMSNorm"] = (norm.forward(x) - hf_norm(x)).abs().max().item()
    diffs["RMSNormFused"] = (y - hf_norm(x + residual)).abs().max().item()

# SwiGLU MLP：gate/up 合并成一个矩阵
cfg = LlamaConfig(hidden_size=E, intermediate_size=I)
hf_mlp = LlamaMLP(cfg)
gate_up = LinearColParallelMerged(E, [I, I])
down = LinearRowParallel(I, E)
gate_up.load_state_dict({"weight": torch.cat([hf_mlp.gate_proj.weight, hf_mlp.up_proj.weight]).detach()})
down.load_state_dict({"weight": hf_mlp.down_proj.weight.detach()})
with torch.no_grad():
    ours = down.forward(silu_and_mul(gate_up.forward(x)))
    diffs["SwiGLU MLP"] = (ours - hf_mlp(x)).abs().max().item()

# RoPE 的三种缩放
scalings = {
    "default": None,
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 512},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512},
}
D, H = 64, 4
positions = torch.tensor([0, 1, 2, 100, 500, 1000, 2047])
q, k = torch.randn(T, H, D), torch.randn(T, H, D)
for name, scaling in scalings.items():
    params = {"rope_type": "default", "rope_theta": 10000.0} if scaling is None else {**scaling, "rope_theta": 10000.0}
    hf_cfg = LlamaConfig(hidden_size=H * D, num_attention_heads=H, head_dim=D, max_position_embeddings=2048,
                         rope_parameters=params)
    cos, sin = LlamaRotaryEmbedding(hf_cfg)(q, positions[None])
    hq, hk = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    rq, rk = get_rope(D, D, 2048, 10000.0, scaling).forward(positions, q, k)
    diff_q, diff_k = (rq - hq[0].transpose(0, 1)).abs().max(), (rk - hk[0].transpose(0, 1)).abs().max()
    diffs[f"RoPE {name}"] = max(diff_q, diff_k).item()

for name, diff in diffs.items():
    print(f"{name:<16} max|diff| = {diff:.1e}")

blocks = OPList([RMSNorm(E, 1e-6), LinearRowParallel(I, E)])
print("OPList 的参数名:", list(blocks.state_dict(prefix="layers")))
wrong = [name for name, diff in diffs.items() if diff > 1e-5]
if wrong:
    raise SystemExit(f"these layers do not match transformers: {wrong}")
