# Tangled from book/chapters/ch05_tensor_parallel.ipynb — edit the notebook, not this file.
"""第 5 章：TP=2（两个进程，gloo）与 TP=1 的 logits、贪心 token 相同；切分的算术与报错。"""
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from minisgl.distributed import (DistributedInfo, destroy_distributed, get_tp_info, init_distributed, kv_head_range,
                                 set_tp_info, shard_range, vocab_range)
from minisgl.models import ModelConfig, SimpleKVCache, create_model, greedy_generate, load_weight
from minisgl.utils.hf import load_hf_config

pytestmark = pytest.mark.usefixtures("tp1")  # 测试主进程是 TP=1；TP=2 的子进程各自设置
PROMPT = [9707, 11, 847, 829, 374, 11097, 13, 3555, 374, 279, 6722, 315, 9625, 30]
MODELS = ["tiny_qwen3", "tiny_qwen3_moe", "kv1_odd_vocab"]


def run_model(path: str, device: str = "cpu") -> dict:
    """在本进程的 TP 位置上构造、加载、前向、贪心生成；也记下几个参数的形状，证明真的切分了。"""
    with torch.device(device):
        model = create_model(ModelConfig.from_hf(load_hf_config(path)))
    load_weight(model, path)
    ids = torch.tensor(PROMPT, device=device)
    kv_cache = SimpleKVCache(model.config, len(PROMPT), ids.device, torch.float32)
    logits = model.lm_head.forward(model.model.forward(ids, torch.arange(len(PROMPT), device=device), kv_cache))
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    return {"logits": logits.cpu(), "tokens": greedy_generate(model, PROMPT, max_new_tokens=16), "shapes": shapes}


def tp_worker(rank: int, size: int, addr: str, paths: list, out: str, device_type: str = "cpu") -> None:
    """mp.spawn 的入口。device_type="cuda" 时第 rank 个进程用第 rank 块 GPU，进程组随之换成 NCCL。"""
    torch.set_num_threads(1)
    set_tp_info(rank, size)
    device = torch.device(f"cuda:{rank}") if device_type == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    init_distributed(get_tp_info(), device, addr)
    try:
        torch.save([run_model(p, str(device)) for p in paths], f"{out}.rank{rank}")
    finally:
        destroy_distributed()


@pytest.fixture(scope="module")
def kv1_odd_vocab(tmp_path_factory) -> Path:
    """1 个 KV 头（TP=2 时复制）、词表 151937（TP=2 时补齐 1 行）。"""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(1)
    path = tmp_path_factory.mktemp("kv1_odd_vocab")
    config = Qwen3Config(vocab_size=151937, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=1, head_dim=32, initializer_range=0.5,
                         tie_word_embeddings=False)
    Qwen3ForCausalLM(config).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tp_results(request, tmp_path_factory) -> dict:
    """{模型名: (TP=1 的结果, TP=2 rank 0 的结果, TP=2 rank 1 的结果)}。"""
    paths = [str(request.getfixturevalue(name)) for name in MODELS]
    out = str(tmp_path_factory.mktemp("tp2") / "result")
    mp.spawn(tp_worker, args=(2, f"file://{out}.rdzv", paths, out), nprocs=2)  # file://：不占端口
    tp2 = [torch.load(f"{out}.rank{r}") for r in range(2)]
    return {name: (run_model(p), tp2[0][i], tp2[1][i]) for i, (name, p) in enumerate(zip(MODELS, paths))}


@pytest.mark.parametrize("name", MODELS)
def test_tp2_matches_tp1(name: str, tp_results, request) -> None:
    single, rank0, rank1 = tp_results[name]
    assert rank0["logits"].shape == single["logits"].shape  # [T, V]：all-gather 后去掉了补齐
    torch.testing.assert_close(rank0["logits"], single["logits"], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(rank1["logits"], rank0["logits"], atol=0, rtol=0)  # 每个 rank 的 logits 完全一样
    assert rank0["tokens"] == single["tokens"] == rank1["tokens"]
    assert len(set(single["tokens"])) > 4, "the oracle repeats one token: this test would catch nothing"
    # 两个 rank 真的各拿一半：词表补齐后平分，q 头平分
    vocab, qkv = "model.embed_tokens.weight", "model.layers.0.self_attn.qkv_proj.weight"
    assert rank0["shapes"][vocab][0] == -(-single["shapes"][vocab][0] // 2)
    config = ModelConfig.from_hf(load_hf_config(request.getfixturevalue(name)))
    kv_local = max(config.num_kv_heads // 2, 1)  # KV 头比 rank 少时复制：每个 rank 1 个
    assert rank0["shapes"][qkv][0] == (config.num_qo_heads // 2 + 2 * kv_local) * config.head_dim


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_tp2_on_two_gpus_matches_tp1(tiny_qwen3, tiny_qwen3_moe, tmp_path) -> None:
    """同样的比较放到两块 GPU 上：进程组是 NCCL，张量在 cuda:0 / cuda:1。"""
    paths = [str(tiny_qwen3), str(tiny_qwen3_moe)]
    out = str(tmp_path / "result")
    mp.spawn(tp_worker, args=(2, f"file://{out}.rdzv", paths, out, "cuda"), nprocs=2)
    tp2 = [torch.load(f"{out}.rank{r}") for r in range(2)]
    for i, path in enumerate(paths):
        single = run_model(path, "cuda:0")
        torch.testing.assert_close(tp2[0][i]["logits"], single["logits"], atol=1e-3, rtol=1e-3)
        torch.testing.assert_close(tp2[1][i]["logits"], tp2[0][i]["logits"], atol=0, rtol=0)
        assert tp2[0][i]["tokens"] == single["tokens"] == tp2[1][i]["tokens"]


def test_shard_ranges() -> None:
    ranks = [DistributedInfo(r, 4) for r in range(4)]
    assert [shard_range(64, r, "heads") for r in ranks] == [(0, 16), (16, 32), (32, 48), (48, 64)]
    assert [kv_head_range(8, r) for r in ranks] == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert [kv_head_range(2, r) for r in ranks] == [(0, 1), (0, 1), (1, 2), (1, 2)]  # 复制
    assert [vocab_range(10, r) for r in ranks] == [(0, 3), (3, 6), (6, 9), (9, 10)]
    with pytest.raises(ValueError, match="--tp 4 must divide num_attention_heads=14"):
        shard_range(14, ranks[0], "num_attention_heads")
    with pytest.raises(ValueError, match="--tp 4 is larger than num_key_value_heads=3"):
        kv_head_range(3, ranks[0])


def test_shard_weight(tiny_qwen3) -> None:
    from minisgl.models.weight import shard_weight

    config, rank1 = ModelConfig.from_hf(load_hf_config(tiny_qwen3)), DistributedInfo(1, 2)
    w = torch.arange(64 * 128.0).view(64, 128)  # down_proj：[E, I]，按输入维切
    got = shard_weight("model.layers.0.mlp.down_proj.weight", w, config, rank1)
    assert got.equal(w[:, 64:]) and got.untyped_storage().data_ptr() != w.untyped_storage().data_ptr()  # 是副本
    bias = torch.arange(64.0)  # 行并行层的偏置：不切
    assert shard_weight("model.layers.0.self_attn.o_proj.bias", bias, config, rank1) is bias
    norm = torch.ones(64)  # 不并行的参数原样返回
    assert shard_weight("model.layers.0.input_layernorm.weight", norm, config, rank1) is norm


def collective_worker(rank: int, addr: str, out: str) -> None:
    from minisgl.distributed import all_gather, all_reduce

    set_tp_info(rank, 2)
    init_distributed(get_tp_info(), torch.device("cpu"), addr)
    try:
        x = torch.full((2, 3), float(rank + 1))
        y = all_gather(torch.arange(4.0).view(2, 2) + 10 * rank)
        torch.save((all_reduce(x), y), f"{out}.rank{rank}")
    finally:
        destroy_distributed()


def test_collectives_on_gloo(tmp_path) -> None:
    mp.spawn(collective_worker, args=(f"file://{tmp_path}/rdzv", str(tmp_path / "c")), nprocs=2)
    for r in range(2):
        reduced, gathered = torch.load(tmp_path / f"c.rank{r}")
        assert reduced.tolist() == [[3.0] * 3] * 2  # 1 + 2
        assert gathered.tolist() == [[0.0, 1.0, 10.0, 11.0], [2.0, 3.0, 12.0, 13.0]]  # 沿最后一维按 rank 拼
