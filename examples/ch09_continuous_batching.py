# Tangled from book/chapters/ch09_continuous_batching.ipynb — edit the notebook, not this file.
"""第 9 章：LLM 离线接口；同样的请求，静态批处理与连续批处理的吞吐。"""

import random
import time

from minisgl.core import SamplingParams
from minisgl.llm import LLM

llm = LLM(None, max_running_req=4, page_size=16, max_seq_len_override=512)
questions = ["What is the capital of France?", "Name three primary colors.", "What is 7 times 8?"]
chats = [llm.tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                           add_generation_prompt=True) for q in questions]
for q, out in zip(questions, llm.generate(chats, SamplingParams(max_tokens=40), use_tqdm=False)):
    print(f"{q:<32} → {out['text'].strip()!r} ({out['finish_reason']}, {len(out['token_ids'])} tokens)")

rng = random.Random(0)
prompts = [[rng.randrange(100, 20000) for _ in range(rng.randint(16, 48))] for _ in range(16)]
params = [SamplingParams(max_tokens=rng.choice([4, 8, 16, 64]), ignore_eos=True) for _ in prompts]
total = sum(p.max_tokens for p in params)
llm.generate(prompts[:4], params[:4], use_tqdm=False)  # 预热

t0 = time.perf_counter()
static = []
for i in range(0, len(prompts), 4):  # 静态：一组 4 个，等这一组最慢的结束
    static += llm.generate(prompts[i:i + 4], params[i:i + 4], use_tqdm=False)
t_static = time.perf_counter() - t0
t0 = time.perf_counter()
continuous = llm.generate(prompts, params, use_tqdm=False)  # 连续：全部交给调度器
t_cont = time.perf_counter() - t0
if [o["token_ids"] for o in static] != [o["token_ids"] for o in continuous]:
    raise SystemExit("static and continuous batching must give the same greedy tokens")
print(f"\n16 个请求，共生成 {total} 个 token（每个 4/8/16/64 个），批大小上限 4：")
print(f"  静态批处理: {t_static:5.2f}s  {total / t_static:6.1f} token/s")
print(f"  连续批处理: {t_cont:5.2f}s  {total / t_cont:6.1f} token/s（{t_static / t_cont:.2f} 倍）")
llm.cache.check_integrity()
print(f"结束后：空闲请求槽 {llm.table.num_free}/4，空闲页 {len(llm.cache.free_pages)}，"
      f"前缀缓存里 {llm.cache.prefix_cache.size_info.total_size} 个 token")
