# Tangled from book/chapters/ch06_kvcache.ipynb — edit the notebook, not this file.
"""第 6 章：4 个长短不一的请求拼成一个批，在分页 KV 池上一起 prefill、一起 decode；与逐个运行逐 token 相同。"""

import time
from typing import Dict, List

import torch

from minisgl.attention import create_attention_backend
from minisgl.core import Batch, Context, Req, use_ctx
from minisgl.distributed import set_tp_info
from minisgl.kvcache import MHAKVCache
from minisgl.models import ModelConfig, create_model, load_weight
from minisgl.utils import div_ceil
from minisgl.utils.hf import example_model_path, load_hf_config, load_tokenizer

PAGE, NEW_TOKENS, MAX_TOKENS = 16, 24, 1024
set_tp_info(0, 1)
path = example_model_path()
config = ModelConfig.from_hf(load_hf_config(path))
with torch.device("cpu"):
    model = create_model(config)
load_weight(model, path)
tok = load_tokenizer(path)
questions = ["What is 2+2?", "Name three colors.", "Write a haiku about the sea, please, with a title.",
             "Hi"]
prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                              add_generation_prompt=True)) for q in questions]

pool = MHAKVCache(config.num_layers, num_pages=64, page_size=PAGE, num_kv_heads=config.num_kv_heads,
                  head_dim=config.head_dim, dtype=torch.float32, device=torch.device("cpu"))
page_table = torch.zeros(8, 256, dtype=torch.int32)  # 8 个请求槽，每个最多 256 个 token
ctx = Context(PAGE, page_table, pool, create_attention_backend("torch", pool, page_table, config.num_qo_heads))
free_pages = list(range(pool.num_pages))
pages: Dict[int, List[int]] = {}


def ensure_pages(req: Req) -> None:
    """保证 req 的前 device_len 个位置都有槽：跨过页边界时从空闲列表拿一页，写进页表。"""
    have = pages.setdefault(req.table_idx, [])
    while len(have) * PAGE < req.device_len:
        page = free_pages.pop(0)
        have.append(page)
        start = (len(have) - 1) * PAGE
        page_table[req.table_idx, start:start + PAGE] = torch.arange(page * PAGE, (page + 1) * PAGE)


@torch.inference_mode()
def run(reqs: List[Req], steps: int) -> Dict[int, List[int]]:
    """prefill 一次，再 decode steps-1 次，全部贪心；返回每个请求生成的 token。"""
    out: Dict[int, List[int]] = {r.uid: [] for r in reqs}
    phase = "prefill"
    for _ in range(steps):
        for r in reqs:
            ensure_pages(r)
        batch = Batch(reqs, phase)
        batch.prepare(page_table)
        ctx.attn_backend.prepare_metadata(batch)
        with use_ctx(ctx), ctx.forward_batch(batch):
            logits = model.forward(batch.input_ids, batch.positions)  # [B, V]
        for r, t in zip(reqs, logits.argmax(-1).tolist()):
            out[r.uid].append(t)
            r.complete_one()
            r.append_host(t)
        phase = "decode"
    return out


def make_reqs(indices: List[int]) -> List[Req]:
    return [Req(torch.tensor(prompts[i], dtype=torch.int32), table_idx=i, cached_len=0, output_len=NEW_TOKENS,
                uid=i) for i in indices]


def release() -> None:
    for have in pages.values():
        free_pages.extend(have)
    pages.clear()


t0 = time.perf_counter()
together = run(make_reqs([0, 1, 2, 3]), NEW_TOKENS)
dt = time.perf_counter() - t0
used = sum(len(p) for p in pages.values())
print(f"一个批：4 个请求，提示词 {[len(p) for p in prompts]} 个 token，"
      f"prefill 一次 {sum(len(p) for p in prompts)} 个 token，再 decode {NEW_TOKENS - 1} 步（每步 4 个 token）")
print(f"用了 {used} 页（每页 {PAGE} 个槽），用时 {dt:.2f}s")
release()
alone = {}
for i in range(4):
    alone.update(run(make_reqs([i]), NEW_TOKENS))
    release()
for i, q in enumerate(questions):
    same = together[i] == alone[i]
    print(f"[{i}] {q[:28]:<28} 批内与单独运行逐 token 相同: {same}  → {tok.decode(together[i])[:40]!r}")
    if not same:
        raise SystemExit(f"request {i}: the batched tokens differ from the tokens it gets alone")
assert len(free_pages) == pool.num_pages, "every page must come back"

per_token = 2 * config.num_layers * config.num_kv_heads * config.head_dim * 4  # K+V，每层，fp32 字节
lens = [len(p) + NEW_TOKENS for p in prompts]
reserved = len(lens) * (max(len(p) for p in prompts) + MAX_TOKENS) * per_token
paged = sum(div_ceil(n, PAGE) for n in lens) * PAGE * per_token
print(f"\n每个 token 的 K/V：{per_token // 1024} KiB（{config.num_layers} 层 × {config.num_kv_heads} 个 KV 头 × "
      f"{config.head_dim} 维 × 2 × 4 字节）")
print(f"按 max_tokens={MAX_TOKENS} 给每个请求预留一整块：{reserved / 2**20:6.1f} MiB")
print(f"按页分配（实际长度 {lens}）：      {paged / 2**20:6.1f} MiB（{reserved / paged:.0f} 倍的差距）")
