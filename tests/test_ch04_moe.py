# Tangled from book/chapters/ch04_moe.ipynb — edit the notebook, not this file.
"""第 4 章：MoE 块等于 transformers 的 Qwen3MoeSparseMoeBlock；整个 Qwen3-MoE 的 logits 与贪心 token 逐个相同；
前向不和 CPU 同步；Triton 的 kernel（CPU 上用解释器，GPU 上编译）与参照一致，能录进 CUDA Graph。"""
import dataclasses
import random

import pytest
import torch
import torch.nn.functional as F
from conftest import run_interpreted
from transformers import AutoModelForCausalLM, Qwen3MoeConfig
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

from minisgl.models import ModelConfig, SimpleKVCache, create_model, greedy_generate, init_dummy_weight, load_weight
from minisgl.models.weight import stack_experts
from minisgl.moe import MOE_BACKENDS, MoELayer, create_moe_backend, fused_moe, resolve_moe_backend, select_experts
from minisgl.moe.fused import Blocks, Routing, choose_blocks, one_program_routing, route_and_align
from minisgl.utils import torch_dtype
from minisgl.utils.hf import load_hf_config

pytestmark = pytest.mark.usefixtures("tp1")  # 单进程
PROMPT = [9707, 11, 847, 829, 374, 11097, 13, 3555, 374, 279, 6722, 315, 9625, 30]  # Qwen3 分词器的一句话


def random_layer(T: int, H: int, E: int, I: int, device="cpu", dtype=torch.float32, seed: int = 0):
    """一层随机的专家权重、T 个 token 的输入和路由 logits：(x, gate_up, down, router_logits)。"""
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(T, H, generator=g, device=device).to(dtype)
    gate_up = (torch.randn(E, 2 * I, H, generator=g, device=device) / H ** 0.5).to(dtype)
    down = (torch.randn(E, H, I, generator=g, device=device) / I ** 0.5).to(dtype)
    return x, gate_up, down, (torch.randn(T, E, generator=g, device=device) * 2).to(dtype)


def reference_moe(x, gate_up, down, router_logits, top_k: int, renormalize: bool) -> torch.Tensor:
    """float32 的参照：对每个专家，挑出选了它的 token 算一遍（有同步、有循环，只为清楚）。"""
    x, gate_up, down = x.float(), gate_up.float(), down.float()
    weights, ids = select_experts(router_logits.float(), top_k, renormalize)
    out = torch.zeros_like(x)
    for e in range(gate_up.shape[0]):
        tok, j = (ids == e).nonzero(as_tuple=True)
        gate, up = F.linear(x[tok], gate_up[e]).chunk(2, dim=-1)
        out.index_add_(0, tok, F.linear(F.silu(gate) * up, down[e]) * weights[tok, j, None])
    return out


@pytest.mark.parametrize("norm_topk_prob", [False, True])
@pytest.mark.parametrize("num_tokens", [1, 7, 200])
def test_moe_block_matches_transformers(norm_topk_prob: bool, num_tokens: int) -> None:
    cfg = Qwen3MoeConfig(hidden_size=32, moe_intermediate_size=16, num_experts=8, num_experts_per_tok=3,
                         norm_topk_prob=norm_topk_prob)
    torch.manual_seed(num_tokens)
    block = Qwen3MoeSparseMoeBlock(cfg).eval()
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.5)
    ours = MoELayer(8, 3, 32, 16, norm_topk_prob, create_moe_backend("torch"))
    ours.load_state_dict({"gate_up_proj": block.experts.gate_up_proj.data,
                          "down_proj": block.experts.down_proj.data})
    x = torch.randn(num_tokens, 32)
    with torch.no_grad():
        ref = block(x[None])[0]  # [T, H]
    got = ours.forward(x, x @ block.gate.weight.data.T)
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("fixture", ["tiny_qwen3_moe", "tiny_qwen3_moe_hd128"])
def test_qwen3_moe_matches_transformers(fixture: str, request) -> None:
    path = request.getfixturevalue(fixture)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = hf.generation_config.pad_token_id = None
    config = ModelConfig.from_hf(load_hf_config(path))
    with torch.device("cpu"):
        ours = create_model(config)
    load_weight(ours, path)
    assert type(ours).__name__ == "Qwen3MoeForCausalLM"
    assert ours.state_dict()["model.layers.1.mlp.experts.down_proj"].shape == (8, 64, 32)

    ids = torch.tensor(PROMPT)
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]  # [T, V]
    cache = SimpleKVCache(config, len(PROMPT), ids.device, torch.float32)
    got = ours.lm_head.forward(ours.model.forward(ids, torch.arange(len(PROMPT)), cache))  # 每个位置的 [T, V]
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)

    ref_tokens = hf.generate(ids[None], max_new_tokens=32, do_sample=False)[0, len(PROMPT):].tolist()
    got_tokens = greedy_generate(ours, PROMPT, max_new_tokens=32)
    assert got_tokens == ref_tokens
    assert len(set(ref_tokens)) > 4, "the oracle repeats one token: this test would catch nothing"


def test_grouped_moe_runs_on_the_meta_device() -> None:
    x, gate_up, down, logits = (t.to("meta", torch.bfloat16) for t in random_layer(12, 32, 8, 16))
    out = create_moe_backend("torch").forward(x, gate_up, down, logits, 2, True)
    assert out.is_meta and out.shape == (12, 32)
    with pytest.raises(NotImplementedError):  # 反例：一个专家一次矩阵乘的写法要先数出每个专家几行
        torch.bincount(logits.argmax(-1), minlength=8).tolist()


INTERPRETED = [  # (T, H, E, K, I, renormalize, 分块)：None 是 choose_blocks 给的 decode 分块
    (1, 32, 8, 3, 16, True, None),
    (7, 48, 16, 4, 24, False, None),
    (3, 32, 12, 5, 16, True, None),
    (50, 32, 8, 3, 16, True, Blocks(32, 64, 64, 64, 4, 2)),
    (50, 64, 8, 3, 32, True, Blocks(64, 16, 32, 32, 4, 2, fuse_sum=False)),  # 求和另起一个 kernel
    (30, 32, 4, 2, 16, False, Blocks(128, 16, 32, 16, 4, 2)),
]
ROUTING = [  # (T, E, K, renormalize)：decode 的形状，E、K 有的不是 2 的幂；两种路由的写法各跑一遍
    (1, 128, 8, True), (1, 6, 3, False), (2, 8, 1, True), (3, 12, 5, True), (5, 20, 6, False),
    (16, 128, 8, False), (2, 160, 8, True),  # E = 160：BLOCK_E = 256 > RANK_MAX_E，route 走 K 轮那一支
]


def check_routing_paths(T: int, E: int, K: int, renorm: bool, bm: int = 16, device: str = "cpu") -> None:
    """route_align（一个实例）与 route + align 给出同样的路由和同样的布局；布局就是 align 的约定。"""
    logits = (torch.randn(T, E, generator=torch.Generator().manual_seed(T * E)) * 2).to(device)
    one, two = (route_and_align(logits, K, renorm, bm, one_program=flag, slots=3) for flag in (True, False))
    w, ids = select_experts(logits, K, renorm)
    assert torch.equal(one.topk_ids.long(), ids)
    torch.testing.assert_close(one.topk_w, w, atol=1e-6, rtol=1e-6)
    if device == "cpu":  # 解释器上逐位相同；GPU 上 softmax 的求和顺序不同，差最后一位
        assert torch.equal(one.topk_w, two.topk_w)
    torch.testing.assert_close(one.topk_w, two.topk_w, atol=1e-6, rtol=1e-6)
    one, two, ids = Routing(*(t.cpu() for t in one)), Routing(*(t.cpu() for t in two)), ids.cpu()
    for name in ("topk_ids", "counts", "starts", "block_expert"):
        assert torch.equal(getattr(one, name), getattr(two, name)), f"T={T} E={E} K={K}: {name}"
    counts = torch.bincount(ids.flatten(), minlength=E)
    padded = (counts + bm - 1) // bm * bm
    assert torch.equal(one.counts.long(), counts)
    assert torch.equal(one.starts.long(), padded.cumsum(0) - padded)
    owner = torch.repeat_interleave(torch.arange(E), padded // bm)  # 每块的专家，后面的块是 -1
    assert one.block_expert[:len(owner)].tolist() == owner.tolist()
    assert (one.block_expert[len(owner):] == -1).all()
    for e, (start, n) in enumerate(zip(one.starts.tolist(), one.counts.tolist())):
        pairs = (ids.flatten() == e).nonzero().flatten().tolist()  # 选了 e 的对，按编号
        assert one.sorted_pairs[start:start + n].tolist() == pairs  # 一个实例：段内按编号排
        assert sorted(two.sorted_pairs[start:start + n].tolist()) == pairs  # 原子加：同一组对，先后不论
    assert one.arrivals.shape == two.arrivals.shape == (T * 3,)  # 每个 token slots 个计数器
    assert not one.arrivals.any() and not two.arrivals.any()  # 两条路都把计数器清了零


def run_interpreted_cases() -> None:
    """在 TRITON_INTERPRET=1 的子进程里运行：这个变量要在 Triton 第一次被导入之前设好。"""
    for T, H, E, K, I, renorm, blocks in INTERPRETED:
        x, gate_up, down, logits = random_layer(T, H, E, I, seed=T)
        got = fused_moe(x, gate_up, down, logits, K, renorm, blocks)
        ref = reference_moe(x, gate_up, down, logits, K, renorm)
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5, msg=lambda m: f"T={T} {blocks}: {m}")
        assert torch.equal(create_moe_backend("triton").forward(x, gate_up, down, logits, K, renorm),
                           fused_moe(x, gate_up, down, logits, K, renorm))
        for flag in (True, False):  # 两种路由的写法，大块小块都一样
            assert torch.equal(fused_moe(x, gate_up, down, logits, K, renorm, blocks, one_program=flag), got)
        b = blocks or choose_blocks(T * K, E, x.dtype)
        for fuse in (True, False):  # 求和在 down 的收尾里，或另起一个 kernel：同样按 k 的顺序加，逐位相同
            assert torch.equal(fused_moe(x, gate_up, down, logits, K, renorm, b._replace(fuse_sum=fuse)), got)
    for T, H, E, K, I, renorm, _ in INTERPRETED:  # 一个对一个实例：两种块形（BN 不整除 I、H 不整除 BK 都有）
        x, gate_up, down, logits = random_layer(T, H, E, I, seed=T)
        ref = reference_moe(x, gate_up, down, logits, K, renorm)
        for b in (choose_blocks(T * K, E, x.dtype, pairs=True), Blocks(1, 16, 4, 32, 4, 1, pairs=True)):
            torch.testing.assert_close(fused_moe(x, gate_up, down, logits, K, renorm, b), ref, atol=1e-5, rtol=1e-5,
                                       msg=lambda m: f"T={T} {b}: {m}")
    assert choose_blocks(8, 128, torch.bfloat16).pairs and not choose_blocks(8, 128, torch.bfloat16, False).pairs
    assert not choose_blocks(8 * 64, 128, torch.bfloat16).pairs
    assert one_program_routing(1, 8, 3) and one_program_routing(8, 128, 8)  # Qwen3-30B-A3B：T ≤ 8
    assert not one_program_routing(9, 128, 8)
    for case in ROUTING:
        check_routing_paths(*case)


def test_triton_kernels_match_reference_interpreted() -> None:
    run_interpreted("test_ch04_moe", "run_interpreted_cases")


def test_select_experts() -> None:
    torch.manual_seed(0)
    logits = torch.randn(50, 16) * 3
    w, ids = select_experts(logits, 4, renormalize=False)
    probs = torch.softmax(logits, dim=-1)
    assert torch.equal(ids, probs.topk(4, dim=-1).indices)
    torch.testing.assert_close(w, probs.gather(1, ids))
    assert (w[:, :-1] >= w[:, 1:]).all() and (w.sum(-1) < 1).all()
    w2, ids2 = select_experts(logits, 4, renormalize=True)
    assert torch.equal(ids2, ids)
    torch.testing.assert_close(w2.sum(-1), torch.ones(50))


def test_stack_experts_any_order() -> None:
    names = [(e, n) for e in range(4) for n in ("gate_up_proj", "down_proj")]
    random.Random(0).shuffle(names)
    stream = [(f"m.layers.0.mlp.experts.{e}.{n}.weight", torch.full((2, 3), float(e))) for e, n in names]
    stream.insert(3, ("m.layers.0.mlp.gate.weight", torch.zeros(4, 3)))
    out = dict(stack_experts(iter(stream), num_experts=4))
    assert sorted(out) == ["m.layers.0.mlp.experts.down_proj", "m.layers.0.mlp.experts.gate_up_proj",
                           "m.layers.0.mlp.gate.weight"]
    assert out["m.layers.0.mlp.experts.down_proj"].shape == (4, 2, 3)
    assert out["m.layers.0.mlp.experts.down_proj"][:, 0, 0].tolist() == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(ValueError, match="only some experts"):
        list(stack_experts(iter(stream[:-2]), num_experts=4))


def test_moe_backend_registry() -> None:
    assert {"torch", "triton"} <= set(MOE_BACKENDS.names())
    with pytest.raises(ValueError, match="torch"):
        create_moe_backend("fused")
    cpu = torch.device("cpu")
    assert resolve_moe_backend("auto", cpu) == "torch" and resolve_moe_backend("triton", cpu) == "triton"
    assert not create_moe_backend("torch").supports_cuda_graph


def test_dummy_weights_keep_48_bf16_moe_layers_finite(tiny_qwen3_moe) -> None:
    config = dataclasses.replace(ModelConfig.from_hf(load_hf_config(tiny_qwen3_moe)), num_layers=48)
    with torch_dtype(torch.bfloat16):
        model = create_model(config)
    init_dummy_weight(model)
    ids = torch.tensor(PROMPT)
    cache = SimpleKVCache(config, len(PROMPT), ids.device, torch.bfloat16)
    logits = model.lm_head.forward(model.model.forward(ids, torch.arange(len(PROMPT)), cache))  # [T, V] bf16
    assert logits.isfinite().all() and logits.float().std() > 0


QWEN3_30B_LAYER = dict(H=2048, E=128, I=768)  # Qwen3-30B-A3B 的一层：128 个专家，每个 token 选 8 个


def bf16_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """最大误差占参照最大值的比例。"""
    return ((got.float() - ref).abs().max() / ref.abs().max()).item()


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 8, 64, 256, 3000])
def test_gpu_triton_moe_matches_reference(T: int) -> None:
    dev = torch.device("cuda")
    x, gate_up, down, logits = random_layer(T, **QWEN3_30B_LAYER, device=dev, seed=T)
    ref = reference_moe(x, gate_up, down, logits, 8, True)  # float32
    torch.testing.assert_close(fused_moe(x, gate_up, down, logits, 8, True), ref, atol=2e-4, rtol=2e-4)
    xb, gub, db, lb = (t.bfloat16() for t in (x, gate_up, down, logits))
    ref = reference_moe(xb, gub, db, lb, 8, True)  # 同样的 bf16 输入，在 float32 里算
    assert bf16_error(fused_moe(xb, gub, db, lb, 8, True), ref) < 0.02
    first = fused_moe(xb, gub, db, lb, 8, True)
    for _ in range(20):  # 原子加的先后、每个 token 谁最后到，每次都可能不同：结果逐位相同
        assert torch.equal(fused_moe(xb, gub, db, lb, 8, True), first)
    b = choose_blocks(T * 8, 128, torch.bfloat16)  # 求和换成另一种写法（收尾里 / 另起一个 kernel）：逐位相同
    assert torch.equal(fused_moe(xb, gub, db, lb, 8, True, b._replace(fuse_sum=not b.fuse_sum)), first)


@pytest.mark.gpu
def test_gpu_pairs_match_blocks() -> None:
    """一个对一个实例与分块的写法：bf16 上都贴着 float32 参照，彼此只差舍入；各自每次运行逐位相同。"""
    dev = torch.device("cuda")
    for T in (1, 2, 3, 4, 8, 16):
        x, gate_up, down, logits = (t.bfloat16() for t in random_layer(T, **QWEN3_30B_LAYER, device=dev, seed=T))
        ref = reference_moe(x, gate_up, down, logits, 8, True)
        pairs = fused_moe(x, gate_up, down, logits, 8, True, choose_blocks(T * 8, 128, x.dtype, pairs=True))
        blocks = fused_moe(x, gate_up, down, logits, 8, True, choose_blocks(T * 8, 128, x.dtype, pairs=False))
        assert bf16_error(pairs, ref) < 0.02 and bf16_error(blocks, ref) < 0.02, f"T={T}"
        assert bf16_error(pairs, blocks.float()) < 0.01, f"T={T}"
        for _ in range(5):
            again = fused_moe(x, gate_up, down, logits, 8, True, choose_blocks(T * 8, 128, x.dtype, pairs=True))
            assert torch.equal(again, pairs), f"T={T}"


@pytest.mark.gpu
def test_gpu_routing_paths_agree() -> None:
    """编译到 GPU 上，两种路由的写法也给出同样的专家和布局；输出只差舍入（softmax 的求和顺序不同）。"""
    for case in ROUTING + [(T, 128, 8, True) for T in (2, 4, 8)]:
        check_routing_paths(*case, device="cuda")
    dev = torch.device("cuda")
    for T in (1, 3, 8):
        x, gate_up, down, logits = (t.bfloat16() for t in random_layer(T, **QWEN3_30B_LAYER, device=dev, seed=T))
        one, two = (fused_moe(x, gate_up, down, logits, 8, True, one_program=flag) for flag in (True, False))
        assert bf16_error(one, two.float()) < 0.01, f"T={T}"


@pytest.mark.gpu
def test_gpu_grouped_moe_matches_reference() -> None:
    """GroupedMoe 在 GPU 上也对：bf16 走 torch._grouped_mm 读显存里段边界的实现。"""
    dev = torch.device("cuda")
    for T in (1, 64, 3000):
        x, gate_up, down, logits = (t.bfloat16() for t in random_layer(T, **QWEN3_30B_LAYER, device=dev, seed=T))
        got = create_moe_backend("torch").forward(x, gate_up, down, logits, 8, True)
        assert bf16_error(got, reference_moe(x, gate_up, down, logits, 8, True)) < 0.02, f"T={T}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_triton_moe_replays_in_a_cuda_graph(dtype: torch.dtype) -> None:
    dev = torch.device("cuda")
    backend = create_moe_backend(resolve_moe_backend("auto", dev))
    assert type(backend).__name__ == "TritonMoe" and backend.supports_cuda_graph
    for T in (1, 2, 3, 64, 256):  # 1–3：一个对一个实例（T ≤ 4）；64、256：分块
        x, gate_up, down, logits = random_layer(T, **QWEN3_30B_LAYER, device=dev, dtype=dtype, seed=T)
        backend.forward(x, gate_up, down, logits, 8, True)  # 先跑一遍：编译不能录进图里
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = backend.forward(x, gate_up, down, logits, 8, True)
        for seed in (100, 101):  # 换一组输入、换一种路由：图里的 kernel 自己去读新的数据
            x2, _, _, logits2 = random_layer(T, **QWEN3_30B_LAYER, device=dev, dtype=dtype, seed=seed)
            x.copy_(x2)
            logits.copy_(logits2)
            graph.replay()
            assert torch.equal(out, backend.forward(x, gate_up, down, logits, 8, True)), f"T={T} seed={seed}"


@pytest.mark.gpu
@pytest.mark.parametrize("fixture", ["tiny_qwen3_moe", "tiny_qwen3_moe_hd128"])
def test_gpu_qwen3_moe_matches_transformers(fixture: str, request) -> None:
    path, dev = request.getfixturevalue(fixture), torch.device("cuda")
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(dev).eval()
    hf.generation_config.eos_token_id = hf.generation_config.pad_token_id = None
    with torch.device(dev):
        ours = create_model(ModelConfig.from_hf(load_hf_config(path)))
    load_weight(ours, path)
    assert type(ours.model.layers[0].mlp.experts._backend).__name__ == "TritonMoe"
    ids = torch.tensor(PROMPT, device=dev)
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]  # [T, V]
    cache = SimpleKVCache(ours.config, len(PROMPT), dev, torch.float32)
    got = ours.lm_head.forward(ours.model.forward(ids, torch.arange(len(PROMPT), device=dev), cache))
    torch.testing.assert_close(got, ref, atol=1e-3, rtol=1e-3)
    ref_tokens = hf.generate(ids[None], max_new_tokens=32, do_sample=False)[0, len(PROMPT):].tolist()
    assert greedy_generate(ours, PROMPT, max_new_tokens=32) == ref_tokens
