# Tangled from book/chapters/ch05_tensor_parallel.ipynb — edit the notebook, not this file.
"""第 5 章 main 的工作函数：每个 TP rank 一个进程，在本 rank 的位置上构造、加载、前向、贪心生成。"""

from pathlib import Path
from typing import List

import torch

from minisgl.distributed import destroy_distributed, get_tp_info, init_distributed, set_tp_info
from minisgl.models import ModelConfig, SimpleKVCache, create_model, greedy_generate, load_weight
from minisgl.utils.hf import load_hf_config

PROMPT = [9707, 11, 847, 829, 374, 11097, 13, 3555, 374, 279, 6722, 315, 9625, 30]


def run(path: Path) -> dict:
    """按当前进程的 TP 位置构造模型、加载本 rank 的权重，返回 logits、16 个贪心 token 和几个参数的形状。"""
    with torch.device("cpu"):
        model = create_model(ModelConfig.from_hf(load_hf_config(path)))
    load_weight(model, path)
    ids = torch.tensor(PROMPT)
    kv_cache = SimpleKVCache(model.config, len(PROMPT), ids.device, torch.float32)
    logits = model.lm_head.forward(model.model.forward(ids, torch.arange(len(PROMPT)), kv_cache))  # [T, V]：每个位置
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()
              if k.startswith(("model.embed_tokens", "model.layers.0.self_attn.qkv", "model.layers.0.mlp"))}
    return dict(logits=logits, tokens=greedy_generate(model, PROMPT, max_new_tokens=16), shapes=shapes)


def worker(rank: int, size: int, addr: str, paths: List[Path], out: str) -> None:
    """mp.spawn 的入口：设置 TP 位置、加入进程组，依次跑每个模型，把结果存到 out.rank{rank}。"""
    torch.set_num_threads(1)  # 两个进程分两个核
    set_tp_info(rank, size)
    init_distributed(get_tp_info(), torch.device("cpu"), addr)
    try:
        torch.save([run(p) for p in paths], f"{out}.rank{rank}")
    finally:
        destroy_distributed()
