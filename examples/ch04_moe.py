# Tangled from book/chapters/ch04_moe.ipynb — edit the notebook, not this file.
"""第 4 章：随机初始化的小 Qwen3-MoE，minisgl 与 transformers 逐 token 对比；分组计算与逐 token 循环比速度。"""

import tempfile
import time

import torch
from transformers import Qwen3MoeConfig
from transformers import Qwen3MoeForCausalLM as HFQwen3Moe

from minisgl.distributed import set_tp_info
from minisgl.models import ModelConfig, SimpleKVCache, create_model, greedy_generate, load_weight
from minisgl.moe import create_moe_backend, select_experts
from minisgl.utils.hf import load_hf_config, load_tokenizer, qwen3_tokenizer_dir

set_tp_info(0, 1)  # 单进程：rank 0 / 共 1 个
torch.manual_seed(0)
hf_config = Qwen3MoeConfig(vocab_size=151936, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                           num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, initializer_range=0.5)
hf = HFQwen3Moe(hf_config).eval()
hf.generation_config.eos_token_id = hf.generation_config.pad_token_id = None
with tempfile.TemporaryDirectory() as folder:
    hf.save_pretrained(folder)
    config = ModelConfig.from_hf(load_hf_config(folder))
    with torch.device("cpu"):
        model = create_model(config)
    load_weight(model, folder)
experts = model.state_dict()["model.layers.0.mlp.experts.gate_up_proj"]
print(f"{config.architecture}: {config.num_layers} 层，每层 {config.num_experts} 个专家选 "
      f"{config.num_experts_per_tok} 个，norm_topk_prob={config.norm_topk_prob}；"
      f"第 0 层 gate_up_proj {tuple(experts.shape)}")

tok = load_tokenizer(qwen3_tokenizer_dir())
prompt = tok.encode("用一句话介绍北京。")
ids = torch.tensor(prompt)
with torch.no_grad():
    ref = hf(ids[None]).logits[0]
cache = SimpleKVCache(config, len(prompt), ids.device, torch.float32)
got = model.lm_head.forward(model.model.forward(ids, torch.arange(len(prompt)), cache))  # 每个位置的 [T, V]
print(f"提示词 {len(prompt)} 个 token；logits 与 transformers 的最大差 {(got - ref).abs().max():.2e}"
      f"（logits 本身最大 {ref.abs().max():.1f}）")
ref_tokens = hf.generate(ids[None], max_new_tokens=24, do_sample=False)[0, len(prompt):].tolist()
our_tokens = greedy_generate(model, prompt, max_new_tokens=24)
print(f"24 个贪心 token 逐个相同: {our_tokens == ref_tokens}；不同的 token {len(set(our_tokens))} 个")
if our_tokens != ref_tokens:
    raise SystemExit(f"minisgl and transformers diverge: {our_tokens} vs {ref_tokens}")
print("随机权重的模型说的是乱码：", repr(tok.decode(our_tokens)[:40]))

# 一个中等大小的 MoE 层：512 个 token，64 个专家选 8 个
T, H, E, K, I = 512, 256, 64, 8, 128
x = torch.randn(T, H)
gate_up, down = torch.randn(E, 2 * I, H) / H**0.5, torch.randn(E, H, I) / I**0.5
router = torch.randn(T, E)


def per_token_loop() -> torch.Tensor:
    weights, chosen = select_experts(router, K, renormalize=True)
    out = torch.zeros_like(x)
    for t in range(T):  # 对每个 token、对它的每个专家：T×K 次小矩阵乘
        for j in range(K):
            e = int(chosen[t, j])
            g, u = (x[t] @ gate_up[e].T).chunk(2)
            out[t] += weights[t, j] * (down[e] @ (torch.nn.functional.silu(g) * u))
    return out


backend = create_moe_backend("torch")
threads = torch.get_num_threads()
torch.set_num_threads(1)  # 单线程比较：计时不受机器上其他进程抢核的影响
outputs = {}
for name, fn in [("逐 token 循环", per_token_loop),
                 ("按专家分组", lambda: backend.forward(x, gate_up, down, router, K, True))]:
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        outputs[name] = fn()
        times.append(time.perf_counter() - t0)
    print(f"{name}: {min(times) * 1000:7.1f} ms（3 次里最快的）")
torch.set_num_threads(threads)
diff = (outputs["逐 token 循环"] - outputs["按专家分组"]).abs().max()
print(f"两种写法的输出最大差 {diff:.1e}（输出本身最大 {outputs['按专家分组'].abs().max():.1f}）")
if diff > 1e-4:
    raise SystemExit(f"the grouped MoE differs from the per-token loop by {diff:.1e}")
counts = torch.bincount(select_experts(router, K, True)[1].flatten(), minlength=E)
print(f"{T}×{K} 个 (token, 专家) 对分给 {E} 个专家：最少 {counts.min()}，最多 {counts.max()} 行")
