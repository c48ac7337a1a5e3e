# Tangled from book/chapters/ch08_engine.ipynb — edit the notebook, not this file.
"""第 8 章：Engine 的贪心输出等于 transformers；带 seed 的采样与批无关；top-k/top-p 截断等于逐行的参照实现。"""
import random
from typing import Dict, List

import pytest
import torch
from transformers import AutoModelForCausalLM

from minisgl.core import Batch, Req, SamplingParams
from minisgl.distributed import DistributedInfo
from minisgl.engine import Engine, EngineConfig, graph_batch_sizes
from minisgl.engine.sample import gumbel_noise, top_k_top_p_filter

PROMPTS = [[9707, 11, 847, 829, 374], [3555, 374, 279, 6722, 315, 9625, 30, 13, 11, 847, 1879, 20, 785, 3555, 11,
           847, 829, 374, 9707], [785], [20, 374, 279]]


def generate(engine: Engine, prompts: List[List[int]], params: List[SamplingParams], uids: List[int]) -> List[List[int]]:
    """静态批：一起 prefill、一起 decode 到各自的 max_tokens；页从一个空闲列表里按需拿，结束时全部还回。"""
    P, free = engine.config.page_size, list(range(engine.num_pages))
    owned: Dict[int, List[int]] = {}
    reqs = [Req(torch.tensor(p, dtype=torch.int32), i, 0, sp.max_tokens, uid, sp)
            for i, (p, sp, uid) in enumerate(zip(prompts, params, uids))]
    out: Dict[int, List[int]] = {r.uid: [] for r in reqs}
    batch = Batch(reqs, "prefill")
    with torch.inference_mode():
        while batch.reqs:
            for r in batch.reqs:
                pages = owned.setdefault(r.table_idx, [])
                while len(pages) * P < r.device_len:
                    pages.append(free.pop(random.Random(len(free)).randrange(len(free))))  # 乱序分页
                    start = (len(pages) - 1) * P
                    engine.page_table[r.table_idx, start:start + P] = torch.arange(pages[-1] * P, (pages[-1] + 1) * P)
            engine.prepare_batch(batch)
            result = engine.forward_batch(batch, engine.sampler.prepare(batch.reqs))
            for r, t in zip(batch.reqs, result.next_tokens_cpu.tolist()):
                out[r.uid].append(t)
                r.append_host(t)
            batch = Batch([r for r in batch.reqs if r.remain_len > 0], "decode")
    return [out[u] for u in uids]


def hf_greedy(path, prompt: List[int], n: int, device: str = "cpu") -> List[int]:
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()
    return hf.generate(torch.tensor([prompt], device=device), max_new_tokens=n, do_sample=False, eos_token_id=None,
                       pad_token_id=0)[0, len(prompt):].tolist()


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


def test_seeded_sampling_is_independent_of_the_batch(tiny_qwen3) -> None:
    engine = Engine(EngineConfig(tiny_qwen3, device="cpu", page_size=4, num_pages=256, max_running_req=8,
                                 max_seq_len_override=128))
    try:
        seeded = SamplingParams(temperature=0.9, top_k=40, top_p=0.9, max_tokens=12, seed=7)
        alone = generate(engine, [PROMPTS[1]], [seeded], [100])[0]
        others = [SamplingParams(temperature=t, max_tokens=12) for t in (0.5, 1.3)] + [SamplingParams(max_tokens=12)]
        mixed = generate(engine, [PROMPTS[0], PROMPTS[2], PROMPTS[1], PROMPTS[3]],
                         [others[0], others[1], seeded, others[2]], [5, 6, 101, 7])[2]
        assert alone == mixed
        other_seed = generate(engine, [PROMPTS[1]], [SamplingParams(temperature=0.9, top_k=40, top_p=0.9,
                                                                    max_tokens=12, seed=8)], [100])[0]
        assert other_seed != alone, "a different seed should sample differently"
    finally:
        engine.shutdown()


def reference_filter(row: List[float], k: int, p: float) -> List[float]:
    """逐行、最直白的参照：排序，留前 k 个，再按归一化概率留到累计刚到 p。"""
    order = sorted(range(len(row)), key=lambda i: -row[i])
    kept = order[:k] if k > 0 else order
    probs = torch.tensor([row[i] for i in kept]).softmax(-1).tolist()
    out, acc = [], 0.0
    for i, pr in zip(kept, probs):
        if acc > p:
            break
        out.append(i)
        acc += pr
    return [row[i] if i in out else float("-inf") for i in range(len(row))]


@pytest.mark.parametrize("seed", range(20))
def test_top_k_top_p_filter_matches_reference(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(6, 50, generator=gen) * 3
    ks = [random.Random(seed + i).choice([-1, 1, 5, 50]) for i in range(6)]
    ps = [random.Random(seed * 7 + i).choice([1.0, 0.9, 0.5, 0.01]) for i in range(6)]
    got = top_k_top_p_filter(logits, torch.tensor([k if k > 0 else 50 for k in ks]), torch.tensor(ps))
    for row, k, p, g in zip(logits.tolist(), ks, ps, got.tolist()):
        assert g == reference_filter(row, k, p)


def test_top_k_1_is_greedy_and_gumbel_matches_softmax() -> None:
    logits = torch.randn(8, 100)
    kept = top_k_top_p_filter(logits, torch.ones(8, dtype=torch.int64), torch.ones(8))
    noisy = kept + gumbel_noise(torch.arange(8), torch.full((8,), 3), 100)
    assert torch.equal(noisy.argmax(-1), logits.argmax(-1))
    row = torch.tensor([1.5, 0.5, 0.0, -1.0])
    seeds = torch.arange(40000)
    picks = (row + gumbel_noise(seeds, torch.zeros_like(seeds), 4)).argmax(-1)
    freq = torch.bincount(picks, minlength=4) / len(seeds)
    torch.testing.assert_close(freq, row.softmax(-1), atol=0.01, rtol=0)


def test_config_errors_name_the_flag(tiny_qwen3) -> None:
    with pytest.raises(ValueError, match="--page-size 0"):
        EngineConfig(tiny_qwen3, page_size=0)
    with pytest.raises(ValueError, match="--memory-ratio 1.5"):
        EngineConfig(tiny_qwen3, memory_ratio=1.5)
    with pytest.raises(ValueError, match="--num-pages 2 holds 2 pages"):
        Engine(EngineConfig(tiny_qwen3, device="cpu", num_pages=2, page_size=16, max_seq_len_override=4096))
    assert graph_batch_sizes(20) == [1, 2, 4, 8, 16] and graph_batch_sizes(256)[-1] == 256


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
@pytest.mark.parametrize("fixture", ["tiny_qwen3_hd128", "tiny_llama_hd64"])
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
    """Triton 的小批量矩阵乘与 float32 的参照一致（有无偏置）；每一行与批里的其他行无关（逐 bit 相同）；
    超过 16 行、整除不了的形状由 linear 交给 F.linear。"""
    pytest.importorskip("triton")
    pytest.importorskip("flashinfer")  # linear 的分岔从 fused_kernels 开始
    from minisgl.kernel import gemv, gemv_supported
    from minisgl.layers.base import linear

    torch.manual_seed(0)
    dev = "cuda"
    for N, K in [(6144, 4096), (4096, 12288), (1024, 2048), (4096, 1024), (256, 640)]:
        w = torch.randn(N, K, device=dev, dtype=dtype) / K ** 0.5
        b = torch.randn(N, device=dev, dtype=dtype)
        x = torch.randn(16, K, device=dev, dtype=dtype)
        for M in (1, 3, 16):
            assert gemv_supported(x[:M], w)
            ref = x[:M].float() @ w.float().T
            _close_bf16(gemv(x[:M], w), ref)
            _close_bf16(gemv(x[:M], w, b), ref + b.float())
            assert torch.equal(linear(x[:M], w), gemv(x[:M], w))
        full = gemv(x, w)
        assert all(torch.equal(gemv(x[i:i + 1], w), full[i:i + 1]) for i in range(16))  # 与批无关
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

    monkeypatch.setattr(gemv_module, "_blocks", lambda N, K: (64, 4096, 8))  # 8 × 4096 × 80 × 2 字节 ≈ 5 MB
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
