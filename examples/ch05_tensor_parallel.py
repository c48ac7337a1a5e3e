# Tangled from book/chapters/ch05_tensor_parallel.ipynb — edit the notebook, not this file.
"""第 5 章：两个进程（gloo，CPU）跑 TP=2，logits 和贪心 token 与单进程的 TP=1 相同；Qwen3 和 Qwen3-MoE。"""

import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from minisgl.distributed import free_tcp_address, set_tp_info

from ch05_tp_worker import run, worker  # 同目录的模块：spawn 的子进程也能按名字导入它

if __name__ == "__main__":  # spawn 的子进程会导入 main 模块：只有真正的 main 才往下跑
    common = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, head_dim=32, initializer_range=0.5)
    torch.manual_seed(0)
    models = {"qwen3-kv1": Qwen3ForCausalLM(Qwen3Config(**common, vocab_size=151937, intermediate_size=128,
                                                         num_key_value_heads=1, tie_word_embeddings=True)),
              "qwen3-moe": Qwen3MoeForCausalLM(Qwen3MoeConfig(**common, vocab_size=151936, num_key_value_heads=2,
                                                               num_experts=8, num_experts_per_tok=2,
                                                               moe_intermediate_size=32, norm_topk_prob=True))}
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for name, model in models.items():
            model.save_pretrained(Path(tmp) / name)
            paths.append(Path(tmp) / name)
        t0 = time.perf_counter()
        set_tp_info(0, 1)  # 主进程自己是 TP=1：rank 0 / 共 1 个
        single = [run(p) for p in paths]
        t1 = time.perf_counter()
        addr = free_tcp_address()
        mp.spawn(worker, args=(2, addr, paths, f"{tmp}/tp2"), nprocs=2)
        t2 = time.perf_counter()
        ranks = [torch.load(f"{tmp}/tp2.rank{r}") for r in range(2)]
    print(f"TP=1 用时 {t1 - t0:.1f}s；TP=2（两个进程，gloo，{addr}）用时 {t2 - t1:.1f}s（含进程启动）")
    for i, path in enumerate(paths):
        ref, got = single[i], ranks[0][i]
        print(f"\n{path.name}:")
        for name, shape in ref["shapes"].items():
            print(f"  {name:<42} TP=1 {str(shape):<16} TP=2 每个 rank {got['shapes'][name]}")
        diff = (got["logits"] - ref["logits"]).abs().max().item()
        print(f"  logits 最大差 {diff:.2e}（logits 最大 {ref['logits'].abs().max():.1f}）；"
              f"两个 rank 的 logits 相同 {torch.equal(got['logits'], ranks[1][i]['logits'])}")
        print(f"  16 个贪心 token 相同: {got['tokens'] == ref['tokens']}  {got['tokens'][:8]} ...")
        if got["tokens"] != ref["tokens"] or not torch.allclose(got["logits"], ref["logits"], atol=1e-4, rtol=1e-4):
            raise SystemExit(f"{path.name}: TP=2 differs from TP=1")
