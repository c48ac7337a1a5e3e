# Tangled from book/chapters/ch06_kvcache.ipynb — edit the notebook, not this file.
"""第 6 章：分页 KV 池按槽写入；torch 后端等于稠密因果注意力；批内的模型输出与逐个运行相同。"""
import random
from typing import List, Tuple

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from minisgl.attention import ATTN_BACKENDS, create_attention_backend
from minisgl.core import Batch, Context, Req, SamplingParams, use_ctx
from minisgl.distributed import set_tp_info, try_get_tp_info
from minisgl.kvcache import MHAKVCache
from minisgl.models import ModelConfig, create_model, load_weight
from minisgl.utils.hf import load_hf_config


def make_pool_and_table(num_reqs: int, max_len: int, page_size: int, hkv: int, d: int, device: torch.device,
                        dtype: torch.dtype, seed: int, num_layers: int = 1) -> Tuple[MHAKVCache, torch.Tensor]:
    """一个池子，加一张页表：每个请求槽分到打乱顺序的页（相邻位置可能在不相邻的页里）。"""
    pages_per_req = -(-max_len // page_size)
    pool = MHAKVCache(num_layers, num_reqs * pages_per_req + 3, page_size, hkv, d, dtype, device)
    order = list(range(pool.num_pages))
    random.Random(seed).shuffle(order)
    table = torch.zeros(num_reqs, pages_per_req * page_size, dtype=torch.int32)
    for r in range(num_reqs):
        for j in range(pages_per_req):
            p = order[r * pages_per_req + j]
            table[r, j * page_size:(j + 1) * page_size] = torch.arange(p * page_size, (p + 1) * page_size)
    return pool, table.to(device)


def run_backend(name: str, pool: MHAKVCache, table: torch.Tensor, reqs: List[Req], phase: str, q: torch.Tensor,
                k: torch.Tensor, v: torch.Tensor, num_qo_heads: int) -> torch.Tensor:
    backend = create_attention_backend(name, pool, table, num_qo_heads)
    batch = Batch(reqs, phase)
    batch.prepare(table)
    backend.prepare_metadata(batch)
    return backend.forward(q, k, v, 0, batch)


def check_against_dense(name: str, page_size: int, group: int, head_dim: int, seed: int,
                        device: torch.device, dtype: torch.dtype, atol: float) -> None:
    gen = random.Random(seed)
    hkv = 2
    H = hkv * group
    prefix = [gen.choice([0, 1, 5, 17, 40]) for _ in range(5)]  # 已经缓存的前缀长度
    extend = [gen.choice([1, 3, 16, 33]) for _ in range(5)]  # 这一步的新 token
    pool, table = make_pool_and_table(5, max(p + e for p, e in zip(prefix, extend)) + 1, page_size, hkv, head_dim,
                                      device, dtype, seed)
    torch.manual_seed(seed)
    full_k = [torch.randn(p + e, hkv, head_dim, device=device, dtype=dtype) for p, e in zip(prefix, extend)]
    full_v = [torch.randn(p + e, hkv, head_dim, device=device, dtype=dtype) for p, e in zip(prefix, extend)]
    for i, p in enumerate(prefix):  # 前缀先写进池子：就像前几步已经算过
        if p:
            pool.store_kv(full_k[i][:p], full_v[i][:p], table[i, :p], 0)
    reqs = [Req(torch.zeros(p + e, dtype=torch.int32), i, p, 4, i) for i, (p, e) in enumerate(zip(prefix, extend))]
    q = [torch.randn(e, H, head_dim, device=device, dtype=dtype) for e in extend]
    got = run_backend(name, pool, table, reqs, "prefill", torch.cat(q), torch.cat([k[p:] for k, p in zip(full_k, prefix)]),
                      torch.cat([v[p:] for v, p in zip(full_v, prefix)]), H)
    want = []
    for i, (p, e) in enumerate(zip(prefix, extend)):
        keys = full_k[i].repeat_interleave(group, 1).transpose(0, 1)  # [H, p+e, D]：参照实现用最直白的写法
        values = full_v[i].repeat_interleave(group, 1).transpose(0, 1)
        mask = torch.ones(p + e, p + e, dtype=torch.bool, device=device).tril()[p:]  # 完整因果掩码的最后 e 行
        want.append(F.scaled_dot_product_attention(q[i].transpose(0, 1), keys, values, attn_mask=mask).transpose(0, 1))
    torch.testing.assert_close(got, torch.cat(want), atol=atol, rtol=0)

    # 接着 decode 一步：每个请求 1 个新 token，上下文长度各不相同
    for r in reqs:
        r.complete_one()
        r.append_host(0)
    new_k = torch.randn(5, hkv, head_dim, device=device, dtype=dtype)
    new_v = torch.randn(5, hkv, head_dim, device=device, dtype=dtype)
    qd = torch.randn(5, H, head_dim, device=device, dtype=dtype)
    got = run_backend(name, pool, table, reqs, "decode", qd, new_k, new_v, H)
    for i in range(5):
        keys = torch.cat([full_k[i], new_k[i:i + 1]]).repeat_interleave(group, 1).transpose(0, 1)
        values = torch.cat([full_v[i], new_v[i:i + 1]]).repeat_interleave(group, 1).transpose(0, 1)
        want_i = F.scaled_dot_product_attention(qd[i][:, None], keys, values)[:, 0]  # [H, D]
        torch.testing.assert_close(got[i], want_i, atol=atol, rtol=0)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("seed", [0, 1])
def test_torch_backend_equals_dense_attention(page_size: int, group: int, head_dim: int, seed: int) -> None:
    check_against_dense("torch", page_size, group, head_dim, seed, torch.device("cpu"), torch.float32, 1e-5)


def test_pool_stores_exactly_at_the_given_slots() -> None:
    pool = MHAKVCache(3, num_pages=5, page_size=4, num_kv_heads=2, head_dim=8, dtype=torch.float32,
                      device=torch.device("cpu"))
    slots = torch.tensor([19, 0, 7, 8], dtype=torch.int32)  # 跨页、乱序
    k, v = torch.randn(4, 2, 8), torch.randn(4, 2, 8)
    pool.store_kv(k, v, slots, layer_id=1)
    for layer in range(3):
        kc, vc = pool.k_cache(layer), pool.v_cache(layer)
        assert kc.shape == (20, 2, 8)
        written = torch.zeros(20, dtype=torch.bool)
        if layer == 1:
            written[slots.long()] = True
            torch.testing.assert_close(kc[slots.long()], k, rtol=0, atol=0)
            torch.testing.assert_close(vc[slots.long()], v, rtol=0, atol=0)
        assert (kc[~written] == 0).all() and (vc[~written] == 0).all(), f"layer {layer}: a slot was touched"


def test_sampling_params_reject_bad_values() -> None:
    assert SamplingParams().is_greedy and SamplingParams(temperature=0.7, top_k=1).is_greedy
    assert not SamplingParams(temperature=0.7).is_greedy
    for bad in [dict(temperature=-1), dict(top_k=0), dict(top_p=0.0), dict(top_p=1.5), dict(max_tokens=0),
                dict(seed=-3)]:
        with pytest.raises(ValueError, match=next(iter(bad))):
            SamplingParams(**bad)


def test_registry_and_cpu_errors() -> None:
    assert ATTN_BACKENDS.names() == ["fi", "torch"]
    pool = MHAKVCache(1, 2, 4, 1, 8, torch.float32, torch.device("cpu"))
    with pytest.raises(ValueError, match="--attn fi needs a CUDA device"):
        create_attention_backend("fi", pool, torch.zeros(1, 8, dtype=torch.int32), 1)
    with pytest.raises(ValueError, match="unknown attention backend 'flash'"):
        create_attention_backend("flash", pool, torch.zeros(1, 8, dtype=torch.int32), 1)


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_fi_page_lists_name_exactly_the_tables_slots(page_size: int) -> None:
    """fi 交给 FlashInfer 的 (kv_indptr, 页号, last_page_len) 展开成槽，正好是页表里每个请求的前 device_len 个槽。
    只用到 _kv_indices 的张量运算，CPU 上就能测（FlashInfer 本身只在 GPU 上）。"""
    from types import SimpleNamespace

    from minisgl.attention.fi import FlashInferBackend

    lens = [1, page_size, page_size + 1, 40, 33]
    pool, table = make_pool_and_table(len(lens), max(lens), page_size, 2, 8, torch.device("cpu"), torch.float32, 0)
    reqs = [Req(torch.zeros(n, dtype=torch.int32), i, n - 1, 1, i) for i, n in enumerate(lens)]  # decode：device_len = n
    fake = SimpleNamespace(page_size=page_size, page_table=table, device=torch.device("cpu"))
    indptr, pages, last = FlashInferBackend._kv_indices(fake, reqs)
    offs = torch.arange(page_size)
    for i, n in enumerate(lens):
        mine = pages[indptr[i]:indptr[i + 1]]
        assert len(mine) == -(-n // page_size) and 1 <= last[i] <= page_size
        slots = (mine[:, None] * page_size + offs).flatten()[:(len(mine) - 1) * page_size + int(last[i])]
        assert torch.equal(slots, table[i, :n]), f"request {i} ({n} tokens)"


def test_forward_needs_a_batch() -> None:
    pool = MHAKVCache(1, 2, 4, 1, 8, torch.float32, torch.device("cpu"))
    table = torch.zeros(1, 8, dtype=torch.int32)
    ctx = Context(4, table, pool, create_attention_backend("torch", pool, table, 1))
    with use_ctx(ctx), pytest.raises(RuntimeError, match="no batch is being run"):
        ctx.batch


def batched_greedy(model, config, prompts: List[List[int]], steps: int, page_size: int) -> List[List[int]]:
    """最简单的驱动：每个请求一个页表行，页按需从空闲列表拿；prefill 一次，decode steps-1 次。"""
    max_len = max(len(p) for p in prompts) + steps
    pool, table = make_pool_and_table(len(prompts), max_len, page_size, config.num_kv_heads, config.head_dim,
                                      torch.device("cpu"), torch.float32, seed=3, num_layers=config.num_layers)
    ctx = Context(page_size, table, pool, create_attention_backend("torch", pool, table, config.num_qo_heads))
    reqs = [Req(torch.tensor(p, dtype=torch.int32), i, 0, steps, i) for i, p in enumerate(prompts)]
    out: List[List[int]] = [[] for _ in prompts]
    phase = "prefill"
    with torch.inference_mode(), use_ctx(ctx):
        for _ in range(steps):
            batch = Batch(reqs, phase)
            batch.prepare(table)
            ctx.attn_backend.prepare_metadata(batch)
            with ctx.forward_batch(batch):
                logits = model.forward(batch.input_ids, batch.positions)
            assert logits.shape == (len(reqs), config.vocab_size)
            for r, t in zip(reqs, logits.argmax(-1).tolist()):
                out[r.uid].append(t)
                r.complete_one()
                r.append_host(t)
            phase = "decode"
    return out


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("fixture", ["tiny_qwen3", "tiny_llama"])
def test_batched_model_matches_transformers(fixture: str, page_size: int, request) -> None:
    if try_get_tp_info() is None:
        set_tp_info(0, 1)
    path = request.getfixturevalue(fixture)
    config = ModelConfig.from_hf(load_hf_config(path))
    with torch.device("cpu"):
        model = create_model(config)
    load_weight(model, path)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = [[9707, 11, 847, 829, 374], [3555, 374, 279, 6722, 315, 9625, 30, 13, 11, 847, 1879, 20],
               [785]]
    got = batched_greedy(model, config, prompts, steps=12, page_size=page_size)
    for p, g in zip(prompts, got):
        ref = hf.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False, eos_token_id=None,
                          pad_token_id=0)[0, len(p):].tolist()
        assert g == ref, f"prompt of {len(p)} tokens: {g} != {ref}"


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("name,dtype", [("torch", torch.float32), ("torch", torch.bfloat16), ("fi", torch.bfloat16)])
def test_backends_equal_dense_attention_on_gpu(name: str, dtype: torch.dtype, page_size: int, group: int) -> None:
    if name == "fi":
        pytest.importorskip("flashinfer")
    atol = 1e-4 if dtype == torch.float32 else 2e-2
    check_against_dense(name, page_size, group, 128, 0, torch.device("cuda"), dtype, atol)
