# Tangled from book/chapters/ch03_models.ipynb — edit the notebook, not this file.
"""第 3 章：读 config.json、搭模型、流式加载 safetensors，用最简单的 KV 缓存贪心生成回答。"""

import time

import torch

from minisgl.distributed import set_tp_info
from minisgl.models import ModelConfig, create_model, greedy_generate, load_weight
from minisgl.utils import pick_device, torch_dtype
from minisgl.utils.hf import example_model_path, load_hf_config, load_tokenizer

set_tp_info(0, 1)  # 单进程：rank 0 / 共 1 个
path = example_model_path()
device = pick_device("auto")
dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
config = ModelConfig.from_hf(load_hf_config(path))
print(f"{path.name}: {config.architecture}, {config.num_layers} 层, hidden {config.hidden_size}, "
      f"{config.num_qo_heads} 个 q 头 / {config.num_kv_heads} 个 kv 头, 词表 {config.vocab_size}, "
      f"共享词嵌入 {config.tie_word_embeddings}")

t0 = time.perf_counter()
with torch.device(device), torch_dtype(dtype):
    model = create_model(config)
load_weight(model, path)
n_params = sum(t.numel() for t in model.state_dict().values())
print(f"{n_params / 1e6:.1f}M 参数，{dtype} @ {device}，构造 + 加载用时 {time.perf_counter() - t0:.1f}s")

tokenizer = load_tokenizer(path)
answers = {}
for question in ["What is the capital of France?", "Give me three tips for staying healthy."]:
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                           add_generation_prompt=True)
    prompt_ids = tokenizer.encode(prompt)
    t0 = time.perf_counter()
    out = greedy_generate(model, prompt_ids, max_new_tokens=80, stop_token_ids=[tokenizer.eos_token_id])
    dt = time.perf_counter() - t0
    print(f"\n问: {question}（提示词 {len(prompt_ids)} 个 token）")
    print(f"答: {tokenizer.decode(out, skip_special_tokens=True)!r}")
    print(f"   生成 {len(out)} 个 token，{len(out) / dt:.1f} token/s")
    answers[question] = (prompt_ids, out)

# 同一份权重交给 transformers，贪心生成同样多的 token：应当逐个相同
from transformers import AutoModelForCausalLM

hf = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
prompt_ids, out = answers["What is the capital of France?"]
ref = hf.generate(torch.tensor([prompt_ids], device=device), max_new_tokens=len(out), do_sample=False,
                  eos_token_id=None, pad_token_id=tokenizer.eos_token_id)[0, len(prompt_ids):].tolist()
print(f"\n第一个回答与 transformers 的贪心结果逐 token 相同: {ref == out}（{len(out)} 个 token）")
if ref != out:
    first = next(i for i, (a, b) in enumerate(zip(out, ref)) if a != b)
    raise SystemExit(f"minisgl and transformers diverge at generated token {first}: {out[first]} vs {ref[first]}")
