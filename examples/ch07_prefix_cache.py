# Tangled from book/chapters/ch07_prefix_cache.ipynb — edit the notebook, not this file.
"""第 7 章：共享系统提示词的多轮对话请求分别回放给 naive 和 radix 前缀缓存，数省下的预填充；再在真模型上计时。"""

import random
import time
from typing import Dict, List, Tuple

import torch

from minisgl.attention import create_attention_backend
from minisgl.core import Batch, Context, Req, use_ctx
from minisgl.distributed import set_tp_info
from minisgl.kvcache import BasePrefixCache, MHAKVCache, create_prefix_cache
from minisgl.models import ModelConfig, create_model, load_weight
from minisgl.utils import div_ceil
from minisgl.utils.hf import example_model_path, load_hf_config, load_tokenizer, qwen3_tokenizer_dir

CPU = torch.device("cpu")

# 1. 一棵小树：三个请求共用开头
tok = load_tokenizer(qwen3_tokenizer_dir())
cache = create_prefix_cache("radix", CPU)
next_slot = 0
for text in ["你是一个乐于助人的助手。用户：北京在哪里？", "你是一个乐于助人的助手。用户：上海在哪里？",
             "你是一个乐于助人的助手。用户：北京有多大？"]:
    ids = torch.tensor(tok.encode(text), dtype=torch.int32)
    m = cache.match_prefix(ids)
    new = torch.arange(next_slot, next_slot + len(ids) - m.handle.cached_len, dtype=torch.int32)
    next_slot += len(new)
    cache.insert_prefix(ids, torch.cat([m.indices, new]))
    print(f"{len(ids):2d} 个 token，命中 {m.handle.cached_len:2d} 个：{text}")
print(cache.pretty(lambda t: repr(tok.decode(t))), "\n")

# 2. 一串请求：24 个用户、每人 4 轮，开头都是同一段系统提示词。回答是随机 token：缓存只看 token 是否相同
rng = random.Random(0)


def words(lo: int, hi: int) -> List[int]:
    return [rng.randrange(1000, 30000) for _ in range(rng.randint(lo, hi))]


USERS, TURNS = 24, 4
system = words(400, 400)
histories = [list(system) for _ in range(USERS)]
requests: List[Tuple[List[int], List[int]]] = []  # (提示词, 模型的回答)
for turn in range(TURNS):
    for u in rng.sample(range(USERS), USERS):  # 每一轮里用户到达的先后随机
        histories[u] += words(20, 80)  # 这一轮的问题
        reply = words(30, 150)
        requests.append((list(histories[u]), reply))
        histories[u] += reply

# 理论上限：缓存无限大时，每个请求最多能命中多少（和之前任何一个请求的最长公共前缀）
trie: Dict[int, dict] = {}
upper = 0
for prompt, reply in requests:
    node, hit = trie, 0
    for t in prompt[:-1]:
        if t not in node:
            break
        node, hit = node[t], hit + 1
    upper += hit
    node = trie
    for t in (prompt + reply)[:-1]:
        node = node.setdefault(t, {})


def replay(kind: str, page_size: int, pool_tokens: int) -> Dict[str, float]:
    """把 requests 依次交给缓存，走调度器的流程；kv[槽] 记着槽里"存着"哪个 token，代替真正的 K/V。"""
    cache = create_prefix_cache(kind, CPU, page_size)
    num_pages = pool_tokens // page_size
    free_pages = list(range(num_pages))
    kv = torch.full((pool_tokens,), -1, dtype=torch.int32)
    offsets = torch.arange(page_size, dtype=torch.int32)
    stats = dict(prompt=0, hit=0, evicted=0, cache_s=0.0)

    def release(slots: torch.Tensor) -> None:  # 从页边界开始的一段槽，整页还回去
        free_pages.extend((slots[::page_size] // page_size).tolist())

    for prompt, reply in requests:
        seq = torch.tensor(prompt + reply, dtype=torch.int32)
        kv_len = len(seq) - 1  # 最后一个生成的 token 没有再喂给模型，没有 K/V
        t0 = time.perf_counter()
        m = cache.match_prefix(seq[: len(prompt) - 1])  # 至少留一个 token 做预填充：要用它的 logits
        cache.lock_handle(m.handle)
        hit = m.handle.cached_len
        need_pages = div_ceil(kv_len - hit, page_size)
        if need_pages > len(free_pages):
            evicted = cache.evict((need_pages - len(free_pages)) * page_size)
            stats["evicted"] += len(evicted)
            release(evicted)
        stats["cache_s"] += time.perf_counter() - t0
        assert torch.equal(kv[m.indices], seq[:hit]), "命中的槽里存的不是这些 token"
        pages = torch.tensor(free_pages[:need_pages], dtype=torch.int32)
        del free_pages[:need_pages]
        new = (pages[:, None] * page_size + offsets).flatten()[: kv_len - hit]  # [kv_len - hit]
        kv[new] = seq[hit:kv_len]  # 预填充和解码写下的 K/V
        slots = torch.cat([m.indices, new])
        t0 = time.perf_counter()
        r = cache.insert_prefix(seq[:kv_len], slots)
        release(slots[hit : r.cached_len])  # 运行期间别人已经缓存了的：重复
        release(slots[r.handle.cached_len :])  # 缓存没收下的：不满一页的尾巴（naive 是全部）
        cache.lock_handle(m.handle, unlock=True)
        stats["cache_s"] += time.perf_counter() - t0
        stats["prompt"] += len(prompt)
        stats["hit"] += hit
    cache.check_integrity()
    assert len(free_pages) + cache.size_info.total_size // page_size == num_pages, "有页丢了"
    return stats


total_prompt = sum(len(p) for p, _ in requests)
print(f"{len(requests)} 个请求，提示词共 {total_prompt} 个 token；缓存无限大时最多命中 {upper} 个"
      f"（{upper / total_prompt:.1%}）\n")
print("| 缓存  | 页大小 | KV 池 (token) | 命中 token | 要预填充 | 命中率 | 淘汰 token | 缓存操作耗时 |")
print("|-------|-------:|--------------:|-----------:|---------:|-------:|-----------:|-------------:|")
for kind, page_size, pool_tokens in [("naive", 1, 65536), ("radix", 1, 65536), ("radix", 16, 65536),
                                     ("radix", 1, 8192), ("radix", 16, 8192), ("radix", 1, 4096)]:
    s = replay(kind, page_size, pool_tokens)
    print(f"| {kind} | {page_size:>6} | {pool_tokens:>13} | {s['hit']:>10} | {s['prompt'] - s['hit']:>8} | "
          f"{s['hit'] / s['prompt']:>6.1%} | {s['evicted']:>10} | {s['cache_s'] * 1000:>10.1f}ms |")
    if kind == "radix" and page_size == 1 and pool_tokens == 65536:
        assert s["hit"] == upper, "池足够大时，radix 应该命中理论上限"

# 3. 真模型：命中的前缀不再预填充。下一个 token 和从头算的一样吗？预填充快了多少？
PAGE = 16
set_tp_info(0, 1)
path = example_model_path()
config = ModelConfig.from_hf(load_hf_config(path))
with torch.device("cpu"):
    model = create_model(config)
load_weight(model, path)
mtok = load_tokenizer(path)
pool = MHAKVCache(config.num_layers, num_pages=256, page_size=PAGE, num_kv_heads=config.num_kv_heads,
                  head_dim=config.head_dim, dtype=torch.float32, device=CPU)
page_table = torch.zeros(1, 4096, dtype=torch.int32)  # 一个请求槽就够：请求一个一个跑
ctx = Context(PAGE, page_table, pool, create_attention_backend("torch", pool, page_table, config.num_qo_heads))
free = list(range(pool.num_pages))


@torch.inference_mode()
def prefill(ids: torch.Tensor, cache: BasePrefixCache) -> Tuple[torch.Tensor, int, float]:
    """一个请求的预填充：匹配 → 只为没命中的部分分页、前向 → 插入 → 还掉重复的和没收下的页。"""
    m = cache.match_prefix(ids[:-1])
    cache.lock_handle(m.handle)
    hit = m.handle.cached_len
    n = div_ceil(len(ids) - hit, PAGE)
    pages = torch.tensor(free[:n], dtype=torch.int32)
    del free[:n]
    slots = torch.cat([m.indices, (pages[:, None] * PAGE + torch.arange(PAGE)).flatten()[: len(ids) - hit].int()])
    page_table[0, : len(ids)] = slots
    batch = Batch([Req(ids, table_idx=0, cached_len=hit, output_len=1, uid=0)], "prefill")
    batch.prepare(page_table)
    ctx.attn_backend.prepare_metadata(batch)
    t0 = time.perf_counter()
    with use_ctx(ctx), ctx.forward_batch(batch):
        logits = model.forward(batch.input_ids, batch.positions)[0]  # [V]：最后一个位置的 logits
    seconds = time.perf_counter() - t0
    r = cache.insert_prefix(ids, slots)
    for part in (slots[hit : r.cached_len], slots[r.handle.cached_len :]):
        free.extend((part[::PAGE] // PAGE).tolist())
    cache.lock_handle(m.handle, unlock=True)
    return logits, hit, seconds


rules = " ".join(f"Rule {i}: answer politely, stay on topic and cite section {i} when it applies." for i in range(24))
chats = [[{"role": "user", "content": "What is the capital of France?"}],
         [{"role": "user", "content": "Give me one tip for learning Python."}],
         [{"role": "user", "content": "What is the capital of France?"},
          {"role": "assistant", "content": "The capital of France is Paris."},
          {"role": "user", "content": "And of Italy?"}]]
caches = {"naive": create_prefix_cache("naive", CPU, PAGE), "radix": create_prefix_cache("radix", CPU, PAGE)}
threads = torch.get_num_threads()
torch.set_num_threads(1)  # 单线程：计时不受机器上其他进程的影响
print(f"\n{path.name}，系统提示词 + 对话，page_size={PAGE}，单线程 CPU 上的预填充：")
print("| 请求 | 提示词 token | radix 命中 | naive 预填充 | radix 预填充 | 下一个 token 相同 | logits 最大差 |")
print("|------|-------------:|-----------:|-------------:|-------------:|:-----------------:|--------------:|")
for i, chat in enumerate(chats):
    text = mtok.apply_chat_template([{"role": "system", "content": rules}] + chat, tokenize=False,
                                    add_generation_prompt=True)
    ids = torch.tensor(mtok.encode(text), dtype=torch.int32)
    ref, _, t_naive = prefill(ids, caches["naive"])
    got, hit, t_radix = prefill(ids, caches["radix"])
    same = int(ref.argmax()) == int(got.argmax())
    print(f"| {i} | {len(ids)} | {hit} | {t_naive * 1000:.0f} ms | {t_radix * 1000:.0f} ms | {same} | "
          f"{(ref - got).abs().max():.1e} |")
    assert same, f"request {i}: the next token with a cached prefix differs from a full prefill"
torch.set_num_threads(threads)
