# Tangled from book/chapters/ch08_engine.ipynb — edit the notebook, not this file.
"""第 8 章：Engine 驱动 SmolLM2——逐个生成 vs 一个批，贪心 vs 采样；带 seed 的采样单独跑与混在批里相同；logprobs。"""

import time
from typing import Dict, List

import torch

from minisgl.core import Batch, Req, SamplingParams
from minisgl.engine import Engine, EngineConfig
from minisgl.utils.hf import example_model_path, load_tokenizer

path = example_model_path()
engine = Engine(EngineConfig(model_path=path, page_size=16, num_pages=256, max_running_req=16,
                             max_seq_len_override=512))
tok = load_tokenizer(path)
P = engine.config.page_size
free_pages = list(range(engine.num_pages))
owned: Dict[int, List[int]] = {}


def ensure_pages(req: Req) -> None:
    pages = owned.setdefault(req.table_idx, [])
    while len(pages) * P < req.device_len:
        pages.append(free_pages.pop())
        start = (len(pages) - 1) * P
        engine.page_table[req.table_idx, start:start + P] = torch.arange(pages[-1] * P, (pages[-1] + 1) * P)


def generate(prompts: List[List[int]], params: List[SamplingParams],
             logprobs: List | None = None) -> List[List[int]]:
    """所有请求一起 prefill，再一起 decode，直到每个请求都生成了 max_tokens 个 token（静态批）。
    给了 logprobs 列表时，把第 0 个请求每一步的 (logprob, top ids, top logprobs) 追加进去。"""
    reqs = [Req(torch.tensor(p, dtype=torch.int32), i, 0, sp.max_tokens, uid=i, sampling_params=sp)
            for i, (p, sp) in enumerate(zip(prompts, params))]
    out: List[List[int]] = [[] for _ in reqs]
    batch = Batch(reqs, "prefill")
    while batch.reqs:
        for r in batch.reqs:
            ensure_pages(r)
        engine.prepare_batch(batch)
        result = engine.forward_batch(batch, engine.sampler.prepare(batch.reqs))
        if result.copy_done_event is not None:  # GPU 上：等 token 拷回 CPU
            result.copy_done_event.synchronize()
        for i, (r, t) in enumerate(zip(batch.reqs, result.next_tokens_cpu.tolist())):
            out[r.uid].append(t)
            r.append_host(t)
            if logprobs is not None and r.uid == 0 and result.logprobs is not None:
                lp = result.logprobs
                logprobs.append((lp.token_logprobs[i].item(), lp.top_ids[i].tolist(), lp.top_logprobs[i].tolist()))
        batch = Batch([r for r in batch.reqs if r.remain_len > 0], "decode")
    for pages in owned.values():
        free_pages.extend(pages)
    owned.clear()
    return out


questions = ["What is the capital of France?", "Name three colors.", "How many legs does a spider have?",
             "What is 12 times 12?", "Say hello in Spanish.", "Which planet is the largest?",
             "What color is the sky?", "Give me a synonym of happy."]
prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                              add_generation_prompt=True)) for q in questions]
N = 32
greedy = SamplingParams(max_tokens=N, ignore_eos=True)
with torch.inference_mode():
    generate([prompts[0]], [greedy])  # 预热一次
    t0 = time.perf_counter()
    alone = [generate([p], [greedy])[0] for p in prompts]
    t_alone = time.perf_counter() - t0
    sampled = [SamplingParams(temperature=0.7, top_p=0.9, max_tokens=N, ignore_eos=True)] * len(prompts)
    t_batch = t_sampled = float("inf")
    for _ in range(2):  # 贪心、采样交替各跑两遍，各取快的那次：机器忙闲的起伏对两者一样
        t0 = time.perf_counter()
        together = generate(prompts, [greedy] * len(prompts))
        t_batch = min(t_batch, time.perf_counter() - t0)
        t0 = time.perf_counter()
        generate(prompts, sampled)
        t_sampled = min(t_sampled, time.perf_counter() - t0)
total = N * len(prompts)
print(f"{len(prompts)} 个问题，各生成 {N} 个 token（贪心，{engine.dtype}，{engine.device}）")
print(f"  逐个生成（第 3 章的方式）: {t_alone:6.2f}s  {total / t_alone:6.1f} token/s")
print(f"  一个批一起生成:            {t_batch:6.2f}s  {total / t_batch:6.1f} token/s"
      f"（{t_alone / t_batch:.1f} 倍）")
print(f"  同一批采样（T=0.7, top_p=0.9）:  {t_sampled:6.2f}s  {total / t_sampled:6.1f} token/s"
      f"（贪心的 {t_batch / t_sampled:.2f} 倍）")
if together != alone:
    raise SystemExit("the batched greedy tokens differ from the tokens each request gets alone")
print("  两种方式逐 token 相同：", together == alone)
print("  例：", repr(tok.decode(together[0]).split("<|im_end|>")[0]))

seeded = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=16, seed=1234, ignore_eos=True)
others = [SamplingParams(temperature=1.0, top_k=50, max_tokens=16, ignore_eos=True)] * 3
with torch.inference_mode():
    solo = generate([prompts[1]], [seeded])[0]
    mixed = generate([prompts[4], prompts[1], prompts[6], prompts[2]], [others[0], seeded, others[1], others[2]])[1]
print(f"\n带 seed 的采样（temperature=0.8, top_p=0.95）单独跑与混在 4 个请求的批里：相同 {solo == mixed}")
print("  ", repr(tok.decode(solo)))
if solo != mixed:
    raise SystemExit("a seeded request must give the same tokens alone and in a batch")

steps: List = []
with torch.inference_mode():
    answer = generate([prompts[0]], [SamplingParams(max_tokens=4, logprobs=True, top_logprobs=3)], steps)[0]
print("\nlogprobs（模型自己的分布，贪心的前 4 个 token）：")
for t, (lp, ids, lps) in zip(answer, steps):
    alts = "  ".join(f"{tok.decode([i])!r} {v:.2f}" for i, v in zip(ids, lps))
    print(f"  {tok.decode([t])!r:>12} {lp:6.2f}   最可能的 3 个: {alts}")
assert len(free_pages) == engine.num_pages
