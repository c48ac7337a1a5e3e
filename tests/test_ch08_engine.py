# Tangled from book/chapters/ch08_engine.ipynb — edit the notebook, not this file.
"""第 8 章：Engine 的贪心输出等于 transformers；CPU 上的 oneDNN 矩阵乘；采样的截断、抽样、seed、惩罚、logit_bias、logprobs 和掩码。"""
import dataclasses
import gc
import random
import weakref
from dataclasses import replace
from typing import Dict, List, Tuple

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import run_interpreted
from transformers import AutoModelForCausalLM, LogitsProcessor, LogitsProcessorList

from minisgl.core import Batch, Req, SamplingParams
from minisgl.engine import Engine, EngineConfig, Sampler, graph_batch_sizes
from minisgl.engine.sample import relative_probs, sample_inverse_cdf, seeded_uniform, top_k_top_p_candidates
from minisgl.layers.base import linear, onednn_weight

PROMPTS = [[9707, 11, 847, 829, 374], [3555, 374, 279, 6722, 315, 9625, 30, 13, 11, 847, 1879, 20, 785, 3555, 11,
           847, 829, 374, 9707], [785], [20, 374, 279]]
Logprobs = List[Tuple[float, List[int], List[float]]]  # 每一步：(采到的词的 logprob, top ids, top logprobs)


def ensure_pages(engine: Engine, r: Req, owned: Dict[int, List[int]], free: List[int]) -> None:
    """给请求槽 r.table_idx 补够装下 device_len 个 token 的页，从空闲列表里乱序地拿。"""
    P, pages = engine.config.page_size, owned.setdefault(r.table_idx, [])
    while len(pages) * P < r.device_len:
        pages.append(free.pop(random.Random(len(free)).randrange(len(free))))
        start = (len(pages) - 1) * P
        engine.page_table[r.table_idx, start:start + P] = torch.arange(pages[-1] * P, (pages[-1] + 1) * P)


def run(engine: Engine, prompts: List[List[int]], params: List[SamplingParams], uids: List[int],
        prompt_lens: List[int] | None = None, slots: List[int] | None = None
        ) -> Tuple[List[List[int]], List[Logprobs]]:
    """静态批：一起 prefill、一起 decode 到各自的 max_tokens；页从一个空闲列表里按需拿。返回 token 和 logprobs。"""
    free, owned = list(range(engine.num_pages)), {}
    slots = slots or list(range(len(prompts)))
    reqs = [Req(torch.tensor(p, dtype=torch.int32), slot, 0, sp.max_tokens, uid, sp)
            for p, sp, uid, slot in zip(prompts, params, uids, slots)]
    plen = dict(zip(uids, prompt_lens or [len(p) for p in prompts]))
    out: Dict[int, List[int]] = {r.uid: [] for r in reqs}
    lps: Dict[int, Logprobs] = {r.uid: [] for r in reqs}
    batch = Batch(reqs, "prefill")
    with torch.inference_mode():
        while batch.reqs:
            for r in batch.reqs:
                ensure_pages(engine, r, owned, free)
            engine.prepare_batch(batch)
            args = engine.sampler.prepare(batch.reqs, prompt_lens=[plen[r.uid] for r in batch.reqs])
            result = engine.forward_batch(batch, args)
            if result.copy_done_event is not None:  # GPU 上：等 token（和 logprobs）拷回 CPU
                result.copy_done_event.synchronize()
            for i, (r, t) in enumerate(zip(batch.reqs, result.next_tokens_cpu.tolist())):
                out[r.uid].append(t)
                r.append_host(t)
                if result.logprobs is not None and r.sampling_params.logprobs:
                    n, lp = r.sampling_params.top_logprobs, result.logprobs
                    lps[r.uid].append((lp.token_logprobs[i].item(), lp.top_ids[i, :n].tolist(),
                                       lp.top_logprobs[i, :n].tolist()))
            batch = Batch([r for r in batch.reqs if r.remain_len > 0], "decode")
    return [out[u] for u in uids], [lps[u] for u in uids]


def generate(engine: Engine, prompts: List[List[int]], params: List[SamplingParams], uids: List[int]) -> List[List[int]]:
    return run(engine, prompts, params, uids)[0]


def hf_greedy(path, prompt: List[int], n: int, device: str = "cpu", **kwargs) -> List[int]:
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()
    return hf.generate(torch.tensor([prompt], device=device), max_new_tokens=n, do_sample=False, eos_token_id=None,
                       pad_token_id=0, **kwargs)[0, len(prompt):].tolist()


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("fixture", ["tiny_qwen3", "tiny_qwen3_moe", "smollm2"])
def test_engine_greedy_matches_transformers(fixture: str, page_size: int, request) -> None:
    path = request.getfixturevalue(fixture)
    steps = 6 if fixture == "smollm2" else 16
    engine = Engine(EngineConfig(path, device="cpu", page_size=page_size, num_pages=512 // page_size + 8,
                                 max_running_req=8, max_seq_len_override=256))
    try:
        got = generate(engine, PROMPTS, [SamplingParams(max_tokens=steps)] * len(PROMPTS), list(range(len(PROMPTS))))
    finally:
        engine.shutdown()
    for p, g in zip(PROMPTS, got):
        assert g == hf_greedy(path, p, steps), f"prompt of {len(p)} tokens"


def test_engine_is_freed_without_the_garbage_collector(tiny_qwen3) -> None:
    gc.collect()
    gc.disable()  # 只靠引用计数：有环的话，这个引擎和它的 KV 池会一直活到下一次 gc
    try:
        engine = Engine(EngineConfig(tiny_qwen3, device="cpu", num_pages=256, max_seq_len_override=128))
        alive, pool = weakref.ref(engine), weakref.ref(engine.kv_cache)
        engine.shutdown()
        del engine
        assert alive() is None and pool() is None
    finally:
        gc.enable()


needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN")


@needs_onednn
@pytest.mark.parametrize("rows", [1, 3, 17, 64])
@pytest.mark.parametrize("bias", [False, True])
def test_onednn_linear_matches_f_linear(rows: int, bias: bool) -> None:
    g = torch.Generator().manual_seed(rows)
    w, x, b = torch.randn(300, 96, generator=g), torch.randn(rows, 96, generator=g), torch.randn(300, generator=g)
    packed = onednn_weight(w)
    assert packed.is_mkldnn and packed.shape == w.shape
    want = F.linear(x, w, b if bias else None)
    torch.testing.assert_close(linear(x, packed, b if bias else None), want, rtol=1e-5, atol=1e-5)
    wide = torch.cat([x, x], dim=1)[:, :96]  # 行与行不相邻的输入（split 出来的那种视图）
    torch.testing.assert_close(linear(wide, packed), F.linear(x, w), rtol=1e-5, atol=1e-5)


@needs_onednn
def test_engine_uses_onednn_on_cpu_and_the_tokens_stay(tiny_qwen3) -> None:
    prompts, params = PROMPTS, [SamplingParams(max_tokens=12)] * len(PROMPTS)
    outs = {}
    for onednn in (True, False):
        engine = Engine(EngineConfig(tiny_qwen3, device="cpu", num_pages=256, max_seq_len_override=128,
                                     cpu_onednn=onednn))
        try:
            assert engine.matmul == ("onednn" if onednn else "torch")
            linears = [m for layer in engine.model.model.layers for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj,
                                                                     layer.mlp.gate_up_proj, layer.mlp.down_proj)]
            assert all(m.weight.is_mkldnn == onednn for m in linears)
            assert (engine.model.lm_head._onednn is not None) == onednn
            outs[onednn] = generate(engine, prompts, params, list(range(len(prompts))))
        finally:
            engine.shutdown()
    assert outs[True] == outs[False]
    assert outs[True][0] == hf_greedy(tiny_qwen3, prompts[0], 12)


@needs_onednn
def test_onednn_caches_are_capped_unless_the_user_set_them(monkeypatch) -> None:
    """换成 oneDNN 之前，引擎把它的两个 kernel 缓存限到 ONEDNN_CACHE_CAPACITY 项（每个新的行数一项，默认的 1024
    项让长跑的服务内存一直涨）；用户自己设的值不动。"""
    import os

    from minisgl.engine.engine import ONEDNN_CACHE_CAPACITY, _use_onednn
    from minisgl.layers import BaseOP

    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "32")
    assert _use_onednn(BaseOP())
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == str(ONEDNN_CACHE_CAPACITY)
    assert os.environ["LRU_CACHE_CAPACITY"] == "32"


@needs_onednn
def test_engine_keeps_f_linear_when_onednn_fails(tiny_qwen3, monkeypatch) -> None:
    import minisgl.engine.engine as engine_module

    def broken(weight: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("no oneDNN kernel for this platform")

    monkeypatch.setattr(engine_module, "onednn_weight", broken)  # 小矩阵的试算就失败：一个都不换
    engine = Engine(EngineConfig(tiny_qwen3, device="cpu", num_pages=256, max_seq_len_override=128))
    try:
        assert engine.matmul == "torch" and engine.model.lm_head._onednn is None
        out = generate(engine, PROMPTS[:1], [SamplingParams(max_tokens=6)], [0])
    finally:
        engine.shutdown()
    assert out[0] == hf_greedy(tiny_qwen3, PROMPTS[0], 6)


def test_seeded_sampling_is_independent_of_the_batch(tiny_qwen3) -> None:
    """带 seed 的请求单独跑、和三个别的请求一起跑，12 个 token 相同。别的提示词都比它短：注意力不必为它补齐，
    它这一行的 logits 逐位相同，相同与否只取决于随机数（只由 seed 和位置决定）。"""
    engine = Engine(EngineConfig(tiny_qwen3, device="cpu", page_size=4, num_pages=256, max_running_req=8,
                                 max_seq_len_override=128))
    try:
        seeded = SamplingParams(temperature=0.9, top_k=40, top_p=0.9, max_tokens=12, seed=7)
        alone = generate(engine, [PROMPTS[1]], [seeded], [100])[0]
        others = [SamplingParams(temperature=t, max_tokens=12) for t in (0.5, 1.3)] + [SamplingParams(max_tokens=12)]
        mixed = generate(engine, [PROMPTS[0], PROMPTS[2], PROMPTS[1], PROMPTS[3]],
                         [others[0], others[1], seeded, others[2]], [5, 6, 101, 7])[2]
        assert alone == mixed
        other_seed = generate(engine, [PROMPTS[1]], [replace(seeded, seed=8)], [100])[0]
        assert other_seed != alone, "a different seed should sample differently"
    finally:
        engine.shutdown()


def reference_keep(row: List[float], t: float, k: int, p: float, min_p: float) -> List[bool]:
    """逐行、最直白的参照：除以 T，排序，留前 k 个，再按归一化概率留到累计刚到 p，最后 min-p。"""
    order = sorted(range(len(row)), key=lambda i: -row[i])
    kept = order[:k] if k > 0 else order
    probs = torch.tensor([row[i] / t for i in kept], dtype=torch.float64).softmax(-1).tolist()
    out, acc = [], 0.0
    for i, pr in zip(kept, probs):
        if acc > p:
            break
        out.append(i)
        acc += pr
    top = max(probs)
    out = [i for i, pr in zip(kept, probs) if i in out and pr >= min_p * top]
    return [i in out for i in range(len(row))]


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("V", [50, 3000])
def test_filters_match_reference(seed: int, V: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(6, V, generator=gen) * (3 if V == 50 else 0.5)  # 词表大时分布平：top-p 要看很多名
    rng = random.Random(seed)
    ts = [rng.choice([0.5, 1.0, 1.7]) for _ in range(6)]
    ks = [rng.choice([-1, -1, 1, 5, 40]) for _ in range(6)]
    ps = [rng.choice([1.0, 0.99, 0.9, 0.5, 0.01]) for _ in range(6)]
    ps = [0.9 if k < 0 and p == 1 else p for k, p in zip(ks, ps)]  # 这条路上每行都开了 top-k 或 top-p
    ms = [rng.choice([0.0, 0.0, 0.05]) for _ in range(6)]
    w, ids = top_k_top_p_candidates(logits, torch.tensor(ts), torch.tensor([k if k > 0 else V for k in ks]),
                                    torch.tensor(ps), k_max=max((k for k in ks if k > 0), default=0),
                                    p_only=any(k < 0 for k in ks))
    for r in range(6):
        got = sorted(ids[r, (w[r] > 0) & (w[r] >= ms[r])].tolist())  # min-p：w 的最大值是 1
        want = [i for i, keep in enumerate(reference_keep(logits[r].tolist(), ts[r], ks[r], ps[r], ms[r])) if keep]
        assert got == want, f"row {r}"


def test_top_p_one_keeps_every_token() -> None:
    V = 151936  # Qwen3 的词表：15 万个 float32 概率的累加和会超过 1
    sampler = Sampler(torch.device("cpu"), vocab_size=V, random_seed=0)
    params = [SamplingParams(temperature=0.7, top_p=1.0), SamplingParams(temperature=0.7, top_p=0.9),
              SamplingParams(temperature=0.7, top_k=V + 5), SamplingParams(temperature=0.7, top_k=1000, top_p=1.0)]
    args = sampler.prepare(make_reqs(params))
    assert [(g.kind, g.rows.tolist()) for g in args.groups] == [("full", [0, 2]), ("candidates", [1, 3])]
    logits = torch.randn(2, V, generator=torch.Generator().manual_seed(1)) * 2
    w, _ = top_k_top_p_candidates(logits, torch.ones(2), torch.tensor([V, 1000]), torch.tensor([0.9, 1.0]),
                                  k_max=1000, p_only=True)
    assert int((w[1] > 0).sum()) == 1000 and 0 < int((w[0] > 0).sum()) < V


def test_inverse_cdf_matches_softmax_and_top_k_1_is_greedy() -> None:
    row = torch.tensor([1.5, 0.5, 0.0, -1.0, -torch.inf])
    u = torch.tensor([seeded_uniform(s, 3) for s in range(40000)])
    picks = sample_inverse_cdf(relative_probs(row.expand(40000, 5), torch.full((40000,), 0.7)), u)
    freq = torch.bincount(picks, minlength=5) / len(u)
    torch.testing.assert_close(freq, (row / 0.7).softmax(-1), atol=0.01, rtol=0)
    assert freq[4] == 0, "a token with probability 0 is never picked"
    logits = torch.randn(8, 100)
    w, ids = top_k_top_p_candidates(logits, torch.ones(8), torch.ones(8, dtype=torch.int64), torch.ones(8), k_max=1,
                                    p_only=False)
    edge = torch.full((8,), 1 - 2**-23)  # seeded_uniform 能给出的最大值
    for u in (torch.zeros(8), edge):
        assert torch.equal(ids.gather(1, sample_inverse_cdf(w, u)[:, None]).squeeze(1), logits.argmax(-1))
    values = [seeded_uniform(s, p) for s in range(200) for p in range(50)]
    assert 0 <= min(values) and max(values) <= 1 - 2**-23 and len(set(values)) > 9900
    seeds = [0, 1, 2**62 + 5, 2**63 - 1] + list(range(100, 196))  # prepare 一组一次算：数组版与整数版逐位相同
    got = seeded_uniform(np.array(seeds, dtype=np.uint64), np.arange(len(seeds), dtype=np.uint64) * 100003)
    assert got.tolist() == [seeded_uniform(s, j * 100003) for j, s in enumerate(seeds)]


def make_reqs(params: List[SamplingParams], prompt_len: int = 3) -> List[Req]:
    return [Req(torch.arange(prompt_len, dtype=torch.int32), i, 0, 8, uid=i, sampling_params=p)
            for i, p in enumerate(params)]


def test_tiny_temperature_samples_the_argmax() -> None:
    """T 小到 1/T 把 logits 放大到 1e6 以上时，按概率抽就是取最大：小于 1e-5 的走贪心；刚到 1e-5 的（加上 min-p）
    也抽到 argmax，而不是越出词表的编号（w 里最大的若不正好是 1，min-p 会把整行截光）。"""
    V = 1000
    x = torch.randn(3, V, generator=torch.Generator().manual_seed(0)) * 30  # [3, V]
    params = [SamplingParams(temperature=1e-9), SamplingParams(temperature=1e-5),
              SamplingParams(temperature=1e-5, min_p=0.95, seed=3)]
    assert params[0].is_greedy and not params[1].is_greedy
    sampler = Sampler(torch.device("cpu"), V, random_seed=0)
    assert sampler.sample(x, sampler.prepare(make_reqs(params))).tolist() == x.argmax(-1).tolist()
    assert torch.equal(relative_probs(x, torch.full((3,), 1e-5)).amax(-1), torch.ones(3))


def run_race_cases() -> None:
    """在 TRITON_INTERPRET=1 的子进程里运行（这个变量要在 Triton 第一次被导入之前设好）：race_sample 逐行执行。"""
    from minisgl.engine.sample import keep_top_k
    from minisgl.kernel import race_sample

    V, n = 64, 400
    row = torch.randn(V, generator=torch.Generator().manual_seed(0)) * 2

    def race(x: torch.Tensor, keys: torch.Tensor, T: float, k: int, p: float, min_p: float) -> torch.Tensor:
        full = lambda v, dtype: torch.full((len(x),), v, dtype=dtype)  # noqa: E731
        return race_sample(x, keys, full(T, torch.float32), full(k, torch.int64), full(p, torch.float32),
                           full(min_p, torch.float32) if min_p else None).long()

    keys = torch.arange(n, dtype=torch.int64) * 7919 + 1
    for T, k, p, min_p in ((1.0, V, 1.0, 0.0), (0.7, V, 0.95, 0.0), (1.0, 5, 1.0, 0.0), (1.5, V, 1.0, 0.2)):
        got = race(row.expand(n, V).contiguous(), keys, T, k, p, min_p)
        want = reference_probs(row, SamplingParams(temperature=T, top_k=k, top_p=p, min_p=min_p))  # 本章后面
        assert bool((want[got] > 0).all()), f"{(T, k, p, min_p)}: a token outside the kept set"
        freq = torch.bincount(got, minlength=V) / n
        assert (freq - want).abs().max() < 0.08, f"{(T, k, p, min_p)}: {(freq - want).abs().max():.3f}"
    # top-k 和 top-p 都开：keep_top_k 先截 top-k，kernel 在剩下的词上做 top-p（按前 k 名重新归一化的概率）
    x = keep_top_k(row.expand(n, V).contiguous(), torch.full((n,), 8), torch.full((n,), 0.6), 8)
    got = race(x, keys, 1.0, 8, 0.6, 0.0)
    top8 = torch.full((V,), -torch.inf).scatter(0, row.topk(8).indices, row.topk(8).values)
    assert bool((reference_probs(top8, SamplingParams(temperature=1.0, top_p=0.6))[got] > 0).all())
    # 一行的结果只由它的 logits 和种子决定：单独抽、混在一批里抽（bf16 也一样），同一个词
    rows = torch.randn(6, V, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    ks = torch.tensor([5, 17, 29, 31, 37, 41], dtype=torch.int64)
    batch = race(rows, ks, 0.8, V, 0.9, 0.0)
    assert batch.tolist() == [race(rows[i:i + 1], ks[i:i + 1], 0.8, V, 0.9, 0.0).item() for i in range(6)]
    # 分块：一行切成 5 块（V = 300，一块 64 个词），分块赛 1 轮就交给 race_finish、分块赛 3 轮，抽到同一个词
    wide = torch.randn(48, 300, generator=torch.Generator().manual_seed(2)) * 2
    wide[3] = torch.nan
    for T, k, p, min_p in ((1.0, 300, 1.0, 0.0), (0.7, 300, 0.3, 0.0), (1.5, 20, 1.0, 0.2)):
        args = (wide, keys[:48], *[torch.full((48,), v, dtype=d) for v, d in ((T, torch.float32), (k, torch.int64), (p, torch.float32))],
                torch.full((48,), min_p) if min_p else None)
        finished = race_sample(*args, rounds=1, chunk=64)
        assert torch.equal(finished, race_sample(*args, rounds=3, chunk=64))
        assert torch.equal(finished, race_sample(*args))  # 一整块
    # 坏行：NaN 的行不越界；只剩一个词的行抽到它
    assert 0 <= race(torch.full((1, V), torch.nan), ks[:1], 1.0, 5, 0.9, 0.1).item() < V
    one = torch.full((1, V), -torch.inf)
    one[0, 7] = 0.0
    assert race(one, ks[:1], 1.0, V, 0.5, 0.0).item() == 7


def run_gemv_cases() -> None:
    """在 TRITON_INTERPRET=1 的子进程里运行：两个 GEMV kernel 在 CPU 上逐行执行，与 float32 的参照比。"""
    from minisgl.kernel import gemv, gemv_supported
    from minisgl.kernel.matmul import _choose

    g = torch.Generator().manual_seed(0)
    for M, N, K, rows in ((1, 64, 512, True), (1, 12, 768, True), (1, 4096, 256, False), (3, 32, 256, False)):
        assert _choose(M, N, K)[0] == rows
        x, w, b = (torch.randn(*s, generator=g).half() for s in ((M, K), (N, K), (N,)))
        ref = x.float() @ w.float().T
        torch.testing.assert_close(gemv(x, w).float(), ref, rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(gemv(x, w, b).float(), ref + b.float(), rtol=1e-2, atol=1e-2)
        assert not gemv_supported(x, w)  # CPU 的张量：linear 不会走到这里


def test_gemv_interpreted() -> None:
    """批大小 1 的 gemv_rows（两种 BLOCK_K）和 tl.dot 的 gemv，在 CPU 上用 Triton 的解释器执行，与参照一致。"""
    run_interpreted("test_ch08_engine", "run_gemv_cases")


def test_race_sample_interpreted() -> None:
    """GPU 上带 seed 的采样 kernel，在 CPU 上用 Triton 的解释器逐行执行（第 4 章 conftest 的 run_interpreted）：
    采到的词都在集合里、频率与按定义算的分布相符（四种组合，400 次）；top-k 加 top-p；与批无关；一行切成几块、分块赛
    几轮都抽到同一个词；NaN 的行不越界。"""
    run_interpreted("test_ch08_engine", "run_race_cases")


def test_each_step_costs_nothing_when_off() -> None:
    sampler = Sampler(torch.device("cpu"), vocab_size=1000, random_seed=0)
    plain = sampler.prepare(make_reqs([SamplingParams(), SamplingParams(top_k=1, temperature=0.5)]))
    assert plain.greedy and not plain.groups and plain.penalties is None and plain.logit_bias is None
    assert plain.top_logprobs == -1
    args = sampler.prepare(make_reqs([SamplingParams(temperature=0.7, top_p=0.9)] * 3 + [SamplingParams()]))
    (g,) = args.groups
    assert args.mixed and g.kind == "candidates" and g.k_max == 0 and g.p_only and g.min_p is None
    assert g.rows is not None and g.rows.tolist() == [0, 1, 2] and args.penalties is None
    (only_t,) = sampler.prepare(make_reqs([SamplingParams(temperature=0.7)])).groups
    assert only_t.kind == "full" and only_t.rows is None
    (top_k,) = sampler.prepare(make_reqs([SamplingParams(temperature=0.7, top_k=k) for k in (5, 50)])).groups
    assert top_k.kind == "candidates" and top_k.k_max == 50 and not top_k.p_only and not top_k.any_top_p


def test_vocab_mask_allows_only_set_bits() -> None:
    B, V = 3, 100
    W = (V + 31) // 32
    gen = torch.Generator().manual_seed(0)
    sampler = Sampler(torch.device("cpu"), vocab_size=V, random_seed=0)
    for step in range(20):
        logits = torch.randn(B, V, generator=gen)
        allowed = torch.rand(B, V, generator=gen) < 0.2
        allowed[:, 31] = allowed[:, 32] = True  # 第 31 位是 int32 的符号位
        bits = torch.zeros(B, W * 32, dtype=torch.int64)
        bits[:, :V] = allowed.long()
        words = (bits.view(B, W, 32) << torch.arange(32)).sum(-1)  # [B, W]，0..2^32-1
        mask = (words - (words >= 2**31).long() * 2**32).int()  # 按 int32 的补码存
        reqs = make_reqs([SamplingParams(), SamplingParams(temperature=1.0), SamplingParams(temperature=2.0, seed=3)],
                         prompt_len=3 + step)
        args = sampler.prepare(reqs)
        args.vocab_mask = mask
        tokens = sampler.sample(logits, args).tolist()
        assert all(allowed[r, t] for r, t in enumerate(tokens)), (step, tokens)
        assert tokens[0] == logits[0].masked_fill(~allowed[0], -torch.inf).argmax().item()


def test_sampling_params_errors_name_the_field() -> None:
    bad = dict(temperature=-1.0, top_k=0, top_p=0.0, min_p=1.5, max_tokens=0, seed=2**63, stop_token_ids=[-3],
               presence_penalty=2.5, frequency_penalty=-3.0, repetition_penalty=0.0, logit_bias={"x": 1.0},
               top_logprobs=21)
    for name, value in bad.items():
        with pytest.raises(ValueError, match=f"^{name}={value!r} ".replace("[", r"\[").replace("{", r"\{")):
            SamplingParams(**{name: value})
    with pytest.raises(ValueError, match=r"^logit_bias=\{'5': 200\} "):
        SamplingParams(logit_bias={"5": 200})
    with pytest.raises(ValueError, match="^top_logprobs=3 .*logprobs=True"):
        SamplingParams(top_logprobs=3)
    ok = SamplingParams(logit_bias={"5": -100, "12": 2.5}, logprobs=True, top_logprobs=20)
    assert ok.logit_bias_ids == ([5, 12], [-100.0, 2.5]) and ok.max_tokens is None
    for name, value in (("temperature", float("inf")), ("top_p", float("nan"))):  # JSON 也写得出 Infinity、NaN
        with pytest.raises(ValueError, match=f"^{name}="):
            SamplingParams(**{name: value})
    with pytest.raises(dataclasses.FrozenInstanceError):  # 构造之后不能改：改了就绕过了上面的检查
        ok.temperature = -5.0  # type: ignore[misc]
    changed = dataclasses.replace(ok, logit_bias={"7": 1.0})  # 要改就 replace：检查、解析再做一遍
    assert changed.logit_bias_ids == ([7], [1.0])
    with pytest.raises(ValueError, match="^temperature=-5.0 "):
        dataclasses.replace(ok, temperature=-5.0)


def test_config_errors_name_the_flag(tiny_qwen3) -> None:
    with pytest.raises(ValueError, match="--page-size 0"):
        EngineConfig(tiny_qwen3, page_size=0)
    with pytest.raises(ValueError, match="--memory-ratio 1.5"):
        EngineConfig(tiny_qwen3, memory_ratio=1.5)
    with pytest.raises(ValueError, match="--num-threads 0"):
        EngineConfig(tiny_qwen3, num_threads=0)
    with pytest.raises(ValueError, match="--moe-backend 'bogus'"):  # 稠密模型不建它：在这里查
        EngineConfig(tiny_qwen3, moe_backend="bogus")
    # 不经过 argparse 直接填字段（离线的 LLM(**config)）：类型不对时说字段名，在加载模型之前
    for field_value, message in [(dict(page_size="4"), "page_size='4' must be an integer or None"),
                                 (dict(max_running_req=2.5), "max_running_req=2.5 must be an integer$"),
                                 (dict(cuda_graph_max_bs=None), "cuda_graph_max_bs=None must be an integer$"),
                                 (dict(random_seed="x"), "random_seed='x' must be an integer or None"),
                                 (dict(num_pages=True), "num_pages=True must be an integer or None"),
                                 (dict(memory_ratio="0.5"), "memory_ratio='0.5' must be a number")]:
        with pytest.raises(TypeError, match=message):
            EngineConfig(tiny_qwen3, **field_value)
    with pytest.raises(ValueError, match="--num-pages 2 holds 2 pages"):
        Engine(EngineConfig(tiny_qwen3, device="cpu", num_pages=2, page_size=16, max_seq_len_override=4096))
    with pytest.raises(ValueError, match=r"--num-pages 1000000000000 needs .* GiB, more than this machine's"):
        Engine(EngineConfig(tiny_qwen3, device="cpu", num_pages=10**12))  # 不是分配器的 traceback
    with pytest.raises(ValueError, match=r"--cpu-kv-memory-mb 1000000000 needs"):
        Engine(EngineConfig(tiny_qwen3, device="cpu", cpu_kv_memory_mb=10**9))
    assert graph_batch_sizes(20) == [1, 2, 4, 8, 16] and graph_batch_sizes(256)[-1] == 256


class AdditivePenalty(LogitsProcessor):
    """OpenAI 的 presence/frequency penalty，写成 transformers 的 logits processor：只数提示词之后生成的 token。"""

    def __init__(self, prompt_len: int, presence: float, frequency: float) -> None:
        self.prompt_len, self.presence, self.frequency = prompt_len, presence, frequency

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        gen = input_ids[:, self.prompt_len:]
        counts = torch.zeros_like(scores).scatter_add_(1, gen, torch.ones_like(gen, dtype=scores.dtype))
        return scores - self.frequency * counts - self.presence * (counts > 0)


PENALTIES = [dict(repetition_penalty=1.6), dict(presence_penalty=1.5), dict(frequency_penalty=2.0),
             dict(repetition_penalty=1.3, presence_penalty=1.0, frequency_penalty=1.0)]


def hf_penalized(path, prompt: List[int], n: int, pen: Dict[str, float], device: str = "cpu") -> List[int]:
    extra = LogitsProcessorList([AdditivePenalty(len(prompt), pen.get("presence_penalty", 0.0),
                                                 pen.get("frequency_penalty", 0.0))])
    return hf_greedy(path, prompt, n, device, repetition_penalty=pen.get("repetition_penalty", 1.0),
                     logits_processor=extra)


def run_overlapped(engine: Engine, prompts: List[List[int]], params: List[SamplingParams]) -> List[List[int]]:
    """第 11 章的方式：下一步的输入从设备上的 token 表里取，上一步的 token 晚一步才回到 CPU 的 input_ids。"""
    free, owned = list(range(engine.num_pages)), {}
    pool = torch.zeros_like(engine.page_table)  # [R, S]：token 表
    reqs = [Req(torch.tensor(p, dtype=torch.int32), i, 0, sp.max_tokens, i, sp) for i, (p, sp) in
            enumerate(zip(prompts, params))]
    for r in reqs:
        pool[r.table_idx, :len(r.input_ids)] = r.input_ids
    out: List[List[int]] = [[] for _ in reqs]
    batch, last = Batch(reqs, "prefill"), None
    with torch.inference_mode():
        while batch is not None or last is not None:
            launched = None
            if batch is not None:
                for r in batch.reqs:
                    ensure_pages(engine, r, owned, free)
                engine.prepare_batch(batch, pool)
                result = engine.forward_batch(batch, engine.sampler.prepare(batch.reqs, token_pool=pool))
                rows = torch.tensor([r.table_idx for r in batch.reqs])
                pool[rows, torch.tensor([r.cached_len for r in batch.reqs])] = result.next_tokens_gpu
                launched = (batch, result)
            if last is not None:  # 上一步的 token 现在才回到 CPU
                if last[1].copy_done_event is not None:
                    last[1].copy_done_event.synchronize()
                for r, t in zip(last[0].reqs, last[1].next_tokens_cpu.tolist()):
                    out[r.uid].append(t)
                    r.append_host(t)
            last = launched
            live = [r for r in batch.reqs if r.remain_len > 0] if batch is not None else []
            batch = Batch(live, "decode") if live else None
    return out


@pytest.mark.parametrize("pen", PENALTIES, ids=lambda p: ",".join(p))
def test_penalties_match_transformers(tiny_qwen3, pen: Dict[str, float]) -> None:
    engine = Engine(EngineConfig(tiny_qwen3, device="cpu", page_size=1, num_pages=512, max_running_req=8,
                                 max_seq_len_override=128))
    n = 24  # 这个随机模型 24 步之内才会重复一个词：惩罚要有东西可罚
    try:
        params = [SamplingParams(max_tokens=n, **pen), SamplingParams(max_tokens=n),  # 不惩罚的请求混在同一批里
                  SamplingParams(max_tokens=n, **pen), SamplingParams(temperature=0.8, max_tokens=n, **pen)]
        got = generate(engine, PROMPTS, params, [0, 1, 2, 3])
        overlapped = run_overlapped(engine, PROMPTS, params)
    finally:
        engine.shutdown()
    for i in (0, 2):
        assert got[i] == hf_penalized(tiny_qwen3, PROMPTS[i], n, pen), f"prompt {i}"
    assert got[1] == hf_greedy(tiny_qwen3, PROMPTS[1], n)
    assert got[0] != hf_greedy(tiny_qwen3, PROMPTS[0], n), "the penalty should change the greedy output"
    assert overlapped == got, "reading the context from the token pool (overlap) gives the same tokens"


def test_penalties_survive_a_retraction(tiny_qwen3) -> None:
    """一个请求生成到一半被中断，之后以"提示词 + 已生成"为输入、在另一个请求槽里重新 prefill：结果与一口气生成相同。"""
    engine = Engine(EngineConfig(tiny_qwen3, device="cpu", page_size=4, num_pages=256, max_running_req=8,
                                 max_seq_len_override=128))
    try:
        for sp in (SamplingParams(max_tokens=14, presence_penalty=1.2, repetition_penalty=1.2),
                   SamplingParams(temperature=0.9, top_p=0.9, seed=5, max_tokens=14, frequency_penalty=0.8)):
            whole = generate(engine, [PROMPTS[0]], [sp], [42])[0]
            first = generate(engine, [PROMPTS[0]], [replace(sp, max_tokens=6)], [42])[0]
            rest = run(engine, [PROMPTS[0] + first], [replace(sp, max_tokens=8)], [42], prompt_lens=[len(PROMPTS[0])],
                       slots=[5])[0][0]
            assert first + rest == whole, sp
    finally:
        engine.shutdown()


def test_penalties_without_the_token_pool_refuse_a_stale_context() -> None:
    sampler = Sampler(torch.device("cpu"), vocab_size=100, random_seed=0)
    req = make_reqs([SamplingParams(presence_penalty=1.0)])[0]
    req.complete_one()  # 设备上已经多了一个 token，CPU 上的 input_ids 还没有（重叠调度时就是这样）
    with pytest.raises(RuntimeError, match="token_pool"):
        sampler.prepare([req])


def test_logit_bias_forces_and_forbids_tokens(tiny_qwen3) -> None:
    engine = Engine(EngineConfig(tiny_qwen3, device="cpu", page_size=4, num_pages=256, max_running_req=8,
                                 max_seq_len_override=128))
    try:
        plain = generate(engine, [PROMPTS[0]], [SamplingParams(max_tokens=8)], [0])[0]
        params = [SamplingParams(max_tokens=8, logit_bias={"77": 100}),
                  SamplingParams(temperature=1.0, max_tokens=8, logit_bias={"77": 100}),
                  SamplingParams(max_tokens=8, logit_bias={str(t): -100 for t in set(plain)})]
        forced, forced_sampled, banned = generate(engine, [PROMPTS[0]] * 3, params, [1, 2, 3])
    finally:
        engine.shutdown()
    assert forced == [77] * 8 and forced_sampled == [77] * 8
    assert not set(banned) & set(plain)


def test_logprobs_are_the_models_own_distribution(tiny_qwen3) -> None:
    engine = Engine(EngineConfig(tiny_qwen3, device="cpu", page_size=4, num_pages=256, max_running_req=8,
                                 max_seq_len_override=128))
    params = [SamplingParams(max_tokens=6, logprobs=True, top_logprobs=5),
              SamplingParams(temperature=0.8, seed=3, max_tokens=6, logprobs=True, top_logprobs=2,
                             presence_penalty=1.5),  # temperature 和惩罚都不影响报出的 logprobs
              SamplingParams(max_tokens=6), SamplingParams(max_tokens=6, logprobs=True)]
    try:
        tokens, logprobs = run(engine, PROMPTS, params, [0, 1, 2, 3])
    finally:
        engine.shutdown()
    hf = AutoModelForCausalLM.from_pretrained(tiny_qwen3, dtype=torch.float32).eval()
    assert logprobs[2] == []
    for prompt, toks, lps, sp in zip(PROMPTS, tokens, logprobs, params):
        if not sp.logprobs:
            continue
        with torch.inference_mode():
            ref = hf(torch.tensor([prompt + toks])).logits[0].log_softmax(-1)  # [L, V]
        for step, (tok, (lp, ids, vals)) in enumerate(zip(toks, lps)):
            row = ref[len(prompt) - 1 + step]
            assert abs(lp - row[tok].item()) < 1e-4
            want = row.topk(sp.top_logprobs)
            assert ids == want.indices.tolist()
            torch.testing.assert_close(torch.tensor(vals), want.values, atol=1e-4, rtol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("fixture", ["tiny_qwen3_hd128", "tiny_llama_hd64", "tiny_qwen3_moe_hd128"])
def test_gpu_engine_fp32_matches_transformers(fixture: str, request) -> None:
    path = request.getfixturevalue(fixture)
    engine = Engine(EngineConfig(path, device="cuda", dtype="float32", attention_backend="torch", page_size=16,
                                 num_pages=128, max_running_req=16, max_seq_len_override=512))
    try:
        got = generate(engine, PROMPTS, [SamplingParams(max_tokens=16)] * 4, [0, 1, 2, 3])
    finally:
        engine.shutdown()
    for p, g in zip(PROMPTS, got):
        assert g == hf_greedy(path, p, 16, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("fixture", ["tiny_qwen3_hd128", "tiny_llama_hd64", "tiny_qwen3_moe_hd128"])
@pytest.mark.parametrize("split_kv", [True, False])
def test_gpu_graph_replay_equals_eager(fixture: str, split_kv: bool, request, monkeypatch) -> None:
    """同一个批、同一份注意力元数据：回放录好的图与逐个发射同样的 kernel，logits 逐位相同（含补齐的批）。
    split_kv=False：MAX_BS 设成 0，decode 全走 FlashInfer（65 个请求以上的批走的那条路）。"""
    pytest.importorskip("flashinfer")
    from minisgl.attention.fi import FlashInferSplitKVBackend

    if not split_kv:
        monkeypatch.setattr(FlashInferSplitKVBackend, "MAX_BS", 0)
    path = request.getfixturevalue(fixture)
    engine = Engine(EngineConfig(path, device="cuda", dtype="bfloat16", attention_backend="fi", page_size=16,
                                 num_pages=256, max_running_req=64, max_seq_len_override=512, cuda_graph_max_bs=64))
    try:
        sizes = [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
        assert engine.graph_runner.batch_sizes == sizes
        generate(engine, PROMPTS, [SamplingParams(max_tokens=8)] * 4, [0, 1, 2, 3])  # 池子里有真实的 K/V
        table = engine.page_table
        for bs in (1, 3, 4, 11, 27, 45, 64):  # 3、11、27、45 要补齐到 4、16、32、48
            reqs = [Req(torch.randint(0, 1000, (40,), dtype=torch.int32), i, 39, 1, i) for i in range(bs)]
            for i in range(bs):  # 每个请求自己的槽：一批里不能有两个 token 写同一个槽
                table[i, :48] = torch.arange(i * 48, i * 48 + 48)
            batch = Batch(reqs, "decode")
            engine.prepare_batch(batch)
            assert batch.padded_size == next(b for b in sizes if b >= bs)
            with torch.inference_mode(), engine.ctx.forward_batch(batch):
                replayed = engine.graph_runner.replay(batch).clone()
                eager = engine.model.forward(batch.input_ids, batch.positions)
            assert torch.equal(replayed, eager), f"bs={bs}: max diff {(replayed - eager).abs().max()}"
    finally:
        engine.shutdown()


def reference_probs(row: torch.Tensor, sp: SamplingParams) -> torch.Tensor:
    """一行 logits 在 sp 下的采样分布（CPU、float32，用本章的函数；它们已经和逐行的参照比过）。"""
    V = row.shape[0]
    x, t = row[None].float().cpu(), torch.tensor([sp.temperature])
    if 0 < sp.top_k < V or sp.top_p < 1:
        k = sp.top_k if 0 < sp.top_k < V else V
        w, ids = top_k_top_p_candidates(x, t, torch.tensor([k]), torch.tensor([sp.top_p]), k_max=k if k < V else 0,
                                        p_only=k == V)
        w = torch.zeros(1, V).scatter_add_(1, ids, w)
    else:
        w = relative_probs(x, t)
    w = w.masked_fill(w < sp.min_p, 0.0)[0]
    return w / w.sum()


@pytest.mark.gpu
@pytest.mark.parametrize("kw", [dict(temperature=0.7), dict(temperature=0.7, top_p=0.9), dict(temperature=0.7, top_k=20),
                                dict(temperature=0.7, top_k=20, top_p=0.8), dict(temperature=1.0, min_p=0.1),
                                dict(temperature=1.0, top_p=0.9, min_p=0.05)], ids=str)
@pytest.mark.parametrize("seeded", [False, True])
def test_gpu_sampling_keeps_the_filters_and_the_distribution(kw: Dict[str, float], seeded: bool) -> None:
    """没带 seed 的行走 FlashInfer，带 seed 的行走 race_sample：采到的词都在截断留下的集合里，频率与分布相符。"""
    dev, V, n = torch.device("cuda"), 1000, 8192
    row = torch.randn(V, generator=torch.Generator().manual_seed(0)) * 3
    sampler = Sampler(dev, V, random_seed=0)
    params = [SamplingParams(**kw, seed=i if seeded else None) for i in range(n)]
    args = sampler.prepare(make_reqs(params))
    expect = "flashinfer" if not seeded and sampler._fi is not None else "race"
    assert [g.kind for g in args.groups] == [expect]
    tokens = sampler.sample(row.to(dev).expand(n, V).contiguous(), args).cpu()
    want = reference_probs(row, params[0])
    freq = torch.bincount(tokens.long(), minlength=V) / n
    assert bool((want[freq > 0] > 0).all()), "a token outside the kept set was sampled"
    assert (freq - want).abs().max() < 0.03


@pytest.mark.gpu
def test_gpu_seeded_rows_do_not_depend_on_the_batch() -> None:
    """同样的 logits 行、同样的 (seed, 位置)：单独采和混在 40 行的一批里采（带 seed 的 16 行：race_sample 分块赛 2 轮，
    单独时 1 轮），GPU 上也是同一个词（logits 本身随批变是另一回事）。"""
    dev, V = torch.device("cuda"), 151936
    logits = (torch.randn(40, V, generator=torch.Generator().manual_seed(2)) * 2).to(dev, torch.bfloat16)
    sampler = Sampler(dev, V, random_seed=0)
    for sp in (SamplingParams(temperature=0.8, top_p=0.9, seed=11), SamplingParams(temperature=1.0, seed=12),
               SamplingParams(temperature=0.6, top_k=40, min_p=0.05, seed=13)):
        others = [SamplingParams(temperature=1.0), SamplingParams(), SamplingParams(temperature=0.5, top_k=5, seed=1),
                  SamplingParams(temperature=0.9, top_p=0.5), SamplingParams(temperature=0.7, seed=2)] * 8
        alone = sampler.sample(logits[2:3], sampler.prepare(make_reqs([sp])))
        mixed = sampler.sample(logits, sampler.prepare(make_reqs(others[:2] + [sp] + others[2:39])))
        assert alone.item() == mixed[2].item()


@pytest.mark.gpu
def test_gpu_race_sample_compiles_once_per_dtype() -> None:
    """Sampler 启动时编译好 race_sample 的三个 kernel（bf16 和 float32 各一份）；之后批的大小（参数指针的对齐、行数）、
    第几轮、有没有 min-p、有没有惩罚都不再让 Triton 编译：服务中途的编译会让一步 decode 停下来等。"""
    from minisgl.kernel import sample as kernel_sample

    def variants() -> List[int]:  # Triton 3.x 的每个 @jit 函数：device_caches[设备] = (编译好的 kernel 表, …)
        caches = [getattr(k, "device_caches", None) for k in kernel_sample._kernels()]
        if not all(isinstance(c, dict) for c in caches):
            pytest.skip("this Triton keeps its compiled kernels elsewhere")
        return [sum(len(v[0]) for v in c.values()) for c in caches]

    dev, V = torch.device("cuda"), 151936
    sampler = Sampler(dev, V, random_seed=0, dtype=torch.bfloat16)
    warm = variants()  # 别的测试（别的词表大小）先编译过的也算在里面
    for B in (1, 2, 3, 5, 9, 33, 64, 65, 130):
        logits = (torch.randn(B, V, generator=torch.Generator().manual_seed(B)) * 2).to(dev, torch.bfloat16)
        for sp in (SamplingParams(temperature=0.7, top_p=0.9, seed=1), SamplingParams(temperature=0.7, min_p=0.05, seed=2),
                   SamplingParams(temperature=0.7, seed=3),
                   SamplingParams(temperature=0.7, top_p=0.9, presence_penalty=0.5, seed=4)):  # 惩罚：float32 的 logits
            reqs = make_reqs([sp] * B)
            sampler.sample(logits, sampler.prepare(reqs, token_pool=torch.stack([r.input_ids for r in reqs]).to(dev)))
    torch.cuda.synchronize()
    assert variants() == warm


@pytest.mark.gpu
def test_gpu_seeded_top_p_one_cuts_nothing() -> None:
    """带 seed、一组里有的行 top_p=0.9、有的行 top_p=1：top_p=1 的行与整组都不开 top-p 时抽到的词相同（u 相同）。"""
    dev, V, n = torch.device("cuda"), 151936, 512
    logits = (torch.randn(1, V, generator=torch.Generator().manual_seed(3)) * 2).to(dev, torch.bfloat16).expand(n, V)
    sampler = Sampler(dev, V, random_seed=0)
    mixed = [SamplingParams(temperature=0.7, top_k=50, top_p=0.9 if i % 2 else 1.0, seed=i) for i in range(n)]
    plain = [SamplingParams(temperature=0.7, top_k=50, seed=i) for i in range(n)]
    a = sampler.sample(logits, sampler.prepare(make_reqs(mixed)))
    b = sampler.sample(logits, sampler.prepare(make_reqs(plain)))
    assert torch.equal(a[0::2], b[0::2])
    assert not torch.equal(a[1::2], b[1::2])  # top_p=0.9 的行确实截了：u 落在被截的尾巴上时换了词


@pytest.mark.gpu
def test_gpu_penalties_and_logprobs_match_transformers(tiny_qwen3_hd128) -> None:
    path = tiny_qwen3_hd128
    engine = Engine(EngineConfig(path, device="cuda", dtype="float32", attention_backend="torch", page_size=1,
                                 num_pages=1024, max_running_req=8, max_seq_len_override=256, cuda_graph_max_bs=0))
    pen = dict(repetition_penalty=1.3, presence_penalty=1.0, frequency_penalty=1.0)
    params = [SamplingParams(max_tokens=24, logprobs=True, top_logprobs=3, **pen), SamplingParams(max_tokens=24)]
    try:
        (got, plain), (lps, _) = run(engine, PROMPTS[:2], params, [0, 1])
        overlapped = run_overlapped(engine, PROMPTS[:2], params)
    finally:
        engine.shutdown()
    assert got == hf_penalized(path, PROMPTS[0], 24, pen, device="cuda")
    assert plain == hf_greedy(path, PROMPTS[1], 24, "cuda")
    assert overlapped == [got, plain]
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to("cuda").eval()
    with torch.inference_mode():
        ref = hf(torch.tensor([PROMPTS[0] + got], device="cuda")).logits[0].log_softmax(-1).cpu()
    for step, (tok, (lp, ids, _)) in enumerate(zip(got, lps)):
        row = ref[len(PROMPTS[0]) - 1 + step]
        assert abs(lp - row[tok].item()) < 1e-4 and ids == row.topk(3).indices.tolist()


def _close_bf16(got: torch.Tensor, ref: torch.Tensor) -> None:
    """bf16 的两种算法只差舍入：相对误差在 bf16 的两个 ulp（2^-7）以内。"""
    scale = ref.float().abs().max().item()
    torch.testing.assert_close(got.float(), ref.float(), rtol=2 ** -7, atol=2 ** -7 * scale)


@pytest.mark.gpu
def test_gpu_fused_kernels_match_torch(monkeypatch) -> None:
    """FlashInfer 的 rmsnorm（2 维、按头的 3 维且行有步长）、fused_add_rmsnorm、RoPE、silu_and_mul 与第 2 章的写法一致。"""
    pytest.importorskip("flashinfer")
    from minisgl.layers import RMSNorm, RMSNormFused, get_rope, silu_and_mul
    from minisgl.layers.base import _fused_module, fused_kernels

    def both(fn):  # (第 2 章的写法, 融合 kernel)：各自拿一份新的输入，原地的 kernel 也不会互相影响
        out = []
        for flag in ("0", "1"):
            monkeypatch.setenv("MINISGL_FUSED_KERNELS", flag)
            _fused_module.cache_clear()
            out.append(fn())
        return out

    torch.manual_seed(0)
    dev, dt, T, H, Hkv, D, E, I = "cuda", torch.bfloat16, 37, 16, 8, 128, 1024, 3072
    x = torch.randn(T, E, device=dev, dtype=dt)
    assert fused_kernels(x) is not None and fused_kernels(x.float()) is None and fused_kernels(x.cpu()) is None
    qkv = torch.randn(T, (H + 2 * Hkv) * D, device=dev, dtype=dt)
    q, k = qkv[:, :H * D].view(T, H, D), qkv[:, H * D:(H + Hkv) * D].view(T, Hkv, D)  # 行之间有步长

    qn = RMSNorm(D, 1e-6)
    qn.weight = torch.randn(D, device=dev, dtype=dt)
    _close_bf16(*reversed(both(lambda: qn.forward(q))))
    norm = RMSNormFused(E, 1e-6)
    norm.weight = torch.randn(E, device=dev, dtype=dt)
    r = torch.randn(T, E, device=dev, dtype=dt)
    (ref_y, ref_r), (got_y, got_r) = both(lambda: norm.forward(x.clone(), r.clone()))
    assert torch.equal(got_r, ref_r)  # 残差加法：两边都是 bf16 + bf16 舍入一次
    _close_bf16(got_y, ref_y)
    (ref_y, ref_r), (got_y, got_r) = both(lambda: norm.forward(x.clone(), None))
    assert torch.equal(got_r, x)
    _close_bf16(got_y, ref_y)

    rope = get_rope(D, D, 40960, 1e6, None)
    pos = torch.randint(0, 40960, (T,), device=dev, dtype=torch.int32)
    (ref_q, ref_k), (got_q, got_k) = both(lambda: rope.forward(pos, q.clone(), k.clone()))
    _close_bf16(got_q, ref_q)
    _close_bf16(got_k, ref_k)
    gate_up = torch.randn(T, 2 * I, device=dev, dtype=dt)
    _close_bf16(*reversed(both(lambda: silu_and_mul(gate_up))))


@pytest.mark.gpu
@pytest.mark.parametrize("norm", [True, False])
def test_gpu_qk_norm_rope_store_matches_reference(norm: bool) -> None:
    """Triton 的融合 kernel 与 float32 的参照（第 2 章的 norm 和 RoPE）一致：q 原地改写，k、v 进了 out_loc 的槽，
    qkv 里 k、v 的列和池子的其他槽都不动。norm=False 是 Llama（没有 q/k norm）。"""
    pytest.importorskip("triton")
    from minisgl.kernel import qk_norm_rope_store, qk_norm_rope_store_supported
    from minisgl.layers import get_rope
    from minisgl.layers.norm import _rms_norm

    torch.manual_seed(0)
    dev, dt, H, Hkv, D, slots = "cuda", torch.bfloat16, 16, 4, 128, 512
    rope = get_rope(D, D, 40960, 1e6, None)
    for T in (1, 7, 300):
        qkv = torch.randn(T, (H + 2 * Hkv) * D, device=dev, dtype=dt)
        q, k, v = qkv.split([H * D, Hkv * D, Hkv * D], dim=-1)
        q, k, v = q.view(T, H, D), k.view(T, Hkv, D), v.view(T, Hkv, D)
        ref_q, ref_k, old_kv = q.float(), k.float(), qkv[:, H * D:].clone()
        wq, wk = torch.randn(D, device=dev, dtype=dt), torch.randn(D, device=dev, dtype=dt)
        pos = torch.randint(0, 40960, (T,), device=dev, dtype=torch.int32)
        loc = torch.randperm(slots, device=dev)[:T].int()
        k_cache, v_cache = torch.zeros(2, slots, Hkv, D, device=dev, dtype=dt).unbind(0)
        assert qk_norm_rope_store_supported(q, k, v, k_cache, v_cache, D)
        assert not qk_norm_rope_store_supported(q, k, v, k_cache, v_cache, D // 2)  # 只转一部分维度：走老路
        qk_norm_rope_store(q, k, v, pos, rope.table(q.device), wq if norm else None, wk if norm else None, 1e-6,
                           k_cache, v_cache, loc)
        if norm:
            ref_q, ref_k = _rms_norm(ref_q, wq.float(), 1e-6), _rms_norm(ref_k, wk.float(), 1e-6)
        ref_q, ref_k = rope.forward(pos, ref_q, ref_k)  # float32：第 2 章的写法
        _close_bf16(q, ref_q)
        _close_bf16(k_cache[loc.long()], ref_k)
        assert torch.equal(v_cache[loc.long()], v)
        assert torch.equal(qkv[:, H * D:], old_kv)
        untouched = torch.ones(slots, dtype=torch.bool, device=dev)
        untouched[loc.long()] = False
        assert not k_cache[untouched].any() and not v_cache[untouched].any()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_gemv_matches_reference(dtype: torch.dtype) -> None:
    """Triton 的小批量矩阵乘与 float32 的参照一致（有无偏置；批大小 1 时窄的形状走 gemv_rows）；2–16 行时每一行
    与批里的其他行无关（逐 bit 相同）；超过 16 行、整除不了的形状由 linear 交给 F.linear。"""
    pytest.importorskip("triton")
    pytest.importorskip("flashinfer")  # linear 的分岔从 fused_kernels 开始
    from minisgl.kernel import gemv, gemv_supported
    from minisgl.kernel.matmul import _choose
    from minisgl.layers.base import linear

    torch.manual_seed(0)
    dev = "cuda"
    shapes = [(6144, 4096), (4096, 12288), (1024, 2048), (4096, 1024), (256, 640), (128, 2048), (2048, 3072)]
    assert [_choose(1, N, K)[0] for N, K in shapes] == [False, False, True, False, False, True, True]
    for N, K in shapes:
        w = torch.randn(N, K, device=dev, dtype=dtype) / K ** 0.5
        b = torch.randn(N, device=dev, dtype=dtype)
        x = torch.randn(16, K, device=dev, dtype=dtype)
        for M in (1, 2, 3, 16):
            assert gemv_supported(x[:M], w)
            ref = x[:M].float() @ w.float().T
            _close_bf16(gemv(x[:M], w), ref)
            _close_bf16(gemv(x[:M], w, b), ref + b.float())
            assert torch.equal(linear(x[:M], w), gemv(x[:M], w))
        full = gemv(x, w)
        assert all(torch.equal(gemv(x[i:i + 2], w), full[i:i + 2]) for i in range(15))  # 2–16 行：与批无关
        assert all(torch.equal(gemv(x[i:i + 1], w), gemv(x[i:i + 1], w)) for i in range(4))  # 批大小 1：确定
    x, w = torch.randn(17, 1024, device=dev, dtype=dtype), torch.randn(512, 1024, device=dev, dtype=dtype)
    assert not gemv_supported(x, w) and gemv_supported(x[:16], w)
    assert torch.equal(linear(x, w), torch.nn.functional.linear(x, w))  # 17 行：cuBLAS
    assert not gemv_supported(x[:4].float(), w.float()) and not gemv_supported(x[:4, ::2], w[:, ::2])
    assert not gemv_supported(x[:4, :1000], torch.randn(512, 1000, device=dev, dtype=dtype))  # K 整除不了


@pytest.mark.gpu
def test_gpu_gemv_falls_back_when_the_blocks_do_not_fit(monkeypatch) -> None:
    """共享内存放不下规则给的分块（这里故意给一个任何 GPU 都放不下的）：结果来自 cuBLAS，这个形状以后不再走 GEMV。"""
    pytest.importorskip("triton")
    from minisgl.kernel import matmul as gemv_module

    monkeypatch.setattr(gemv_module, "_choose", lambda M, N, K: (False, (64, 4096, 8)))  # 8 × 4096 × 80 × 2 字节 ≈ 5 MB
    monkeypatch.setattr(gemv_module, "_does_not_fit", set())
    x = torch.randn(4, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(256, 4096, device="cuda", dtype=torch.bfloat16)
    assert gemv_module.gemv_supported(x, w)
    assert torch.equal(gemv_module.gemv(x, w), torch.nn.functional.linear(x, w))
    assert not gemv_module.gemv_supported(x, w) and gemv_module._does_not_fit == {(256, 4096)}


def _decode_reference(q, k_cache, v_cache, page_table, table_idx, seq_lens) -> torch.Tensor:
    """float32、逐个请求：把这个请求的 K/V 按页表取出来，GQA 的 kv 头复制 G 份，普通的 softmax 注意力。"""
    B, H, D = q.shape
    G = H // k_cache.shape[1]
    out = torch.empty(B, H, D, dtype=torch.float32, device=q.device)
    for b in range(B):
        slots = page_table[table_idx[b], :seq_lens[b]].long()
        k = k_cache[slots].float().transpose(0, 1).repeat_interleave(G, 0)  # [H, L, D]
        v = v_cache[slots].float().transpose(0, 1).repeat_interleave(G, 0)
        w = torch.softmax(torch.einsum("hd,hld->hl", q[b].float(), k) * D ** -0.5, -1)  # [H, L]
        out[b] = torch.einsum("hl,hld->hd", w, v)
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_split_kv_decode_matches_reference(dtype: torch.dtype) -> None:
    """Triton 的 split-KV decode 与 float32 参照一致：长短不一的请求（1 个 token、正好一段、多一个 token、
    比 S 段还长）、各种 GQA 分组和 head_dim、引擎会选的 S 和别的 S、两种块大小；不支持的 dtype 和形状被拒绝。"""
    pytest.importorskip("triton")
    from minisgl.kernel import split_kv_decode, split_kv_splits, split_kv_supported

    torch.manual_seed(0)
    dev = torch.device("cuda")
    lens = [1, 63, 64, 65, 700, 4100]
    for H, Hkv, D in [(32, 8, 128), (16, 8, 128), (9, 3, 64), (4, 4, 64), (64, 4, 128)]:
        assert split_kv_supported(dtype, H, Hkv, D)
        B, slots = len(lens), 8192
        k_cache = torch.randn(slots, Hkv, D, device=dev, dtype=dtype)
        v_cache = torch.randn(slots, Hkv, D, device=dev, dtype=dtype)
        page_table = torch.stack([torch.randperm(slots, device=dev)[:4200] for _ in range(B + 2)]).int()
        table_idx = torch.randperm(B + 2, device=dev)[:B].int()  # 请求不在页表的前几行
        seq_lens = torch.tensor(lens, device=dev, dtype=torch.int32)
        q = torch.randn(B, H, D, device=dev, dtype=dtype)
        ref = _decode_reference(q, k_cache, v_cache, page_table, table_idx, seq_lens)
        for splits in sorted({1, 4, split_kv_splits(B, Hkv, dev), 64}):
            for block_t in (64, 128):  # _tiles 按实例数在两者之间挑
                got = split_kv_decode(q, k_cache, v_cache, page_table, table_idx, seq_lens, splits, D ** -0.5,
                                      block_t=block_t)
                assert got.dtype == dtype and got.shape == q.shape
                _close_bf16(got, ref)
    assert not split_kv_supported(torch.float32, 32, 8, 128)
    assert not split_kv_supported(dtype, 34, 2, 128)  # 一个 kv 头带 17 个 q 头
    assert not split_kv_supported(dtype, 32, 8, 96)  # head_dim 不是 2 的幂
    assert split_kv_splits(1, 8, dev) >= split_kv_splits(8, 8, dev) >= split_kv_splits(64, 8, dev) == 1


@pytest.mark.gpu
def test_gpu_fi_backend_uses_split_kv_for_small_decode_batches(monkeypatch) -> None:
    """fi 后端：bf16 的 decode 批不大于 MAX_BS（64）时走 split-KV，结果与第 6 章的 FlashInfer 路径一致；多一个请求、
    float32 和 MINISGL_FUSED_KERNELS=0 时仍是 FlashInfer。8 个 kv 头：H200 上 64 个请求是 512 个实例，走 64 个 token 的块。"""
    pytest.importorskip("flashinfer")
    pytest.importorskip("triton")
    from minisgl.attention import create_attention_backend
    from minisgl.attention.fi import FlashInferBackend, FlashInferSplitKVBackend, SplitKVDecode
    from minisgl.kvcache import MHAKVCache

    torch.manual_seed(0)
    dev, H, Hkv, D, P = torch.device("cuda"), 16, 8, 128, 16
    most = FlashInferSplitKVBackend.MAX_BS
    pool = MHAKVCache(1, num_pages=2048, page_size=P, num_kv_heads=Hkv, head_dim=D, dtype=torch.bfloat16, device=dev)
    pool.k_cache(0).normal_()
    pool.v_cache(0).normal_()
    pages = torch.randperm(2048, device=dev)[:(most + 1) * 20].view(most + 1, 20, 1)  # 每个请求 20 个乱序的页
    table = (pages * P + torch.arange(P, device=dev)).flatten(1).int()  # [65, 320]：页内的槽连续，和分配器给的一样

    def decode_batch(n: int) -> Batch:
        """n 个 decode 请求，上下文 1–319 个 token（这一步的 token 是最后一个，K/V 已经在池子里）。"""
        lens = random.Random(n).choices([1, 2, 60, 64, 65, 200, 319], k=n)
        batch = Batch([Req(torch.zeros(L, dtype=torch.int32), i, L - 1, 4, i) for i, L in enumerate(lens)], "decode")
        batch.prepare(table)
        return batch

    def attend(backend, batch: Batch, q: torch.Tensor) -> torch.Tensor:
        backend.prepare_metadata(batch)
        with torch.inference_mode():
            return backend.forward(q, q[:, :Hkv], q[:, :Hkv], 0, batch, save_kv=False)  # [B, H, D]

    fi = create_attention_backend("fi", pool, table, H)
    for n in (1, 5, 16, 40, most):
        batch = decode_batch(n)
        q = torch.randn(n, H, D, device=dev, dtype=torch.bfloat16)
        got = attend(fi, batch, q)
        assert isinstance(batch.attn_metadata.wrapper, SplitKVDecode)
        want = attend(FlashInferBackend(pool, table, H), batch, q)  # 第 6 章：FlashInfer 的 decode
        assert not isinstance(batch.attn_metadata.wrapper, SplitKVDecode)
        _close_bf16(got, want)
    batch = decode_batch(most + 1)
    fi.prepare_metadata(batch)
    assert not isinstance(batch.attn_metadata.wrapper, SplitKVDecode)
    fp32 = MHAKVCache(1, num_pages=8, page_size=P, num_kv_heads=Hkv, head_dim=D, dtype=torch.float32, device=dev)
    assert not create_attention_backend("fi", fp32, table, H).split_kv
    monkeypatch.setenv("MINISGL_FUSED_KERNELS", "0")
    assert not create_attention_backend("fi", pool, table, H).split_kv
