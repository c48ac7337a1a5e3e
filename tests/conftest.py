# Tangled from book/chapters/ch01_skeleton.ipynb and ch09_continuous_batching.ipynb — edit the notebooks, not this file.
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    """@pytest.mark.gpu 的测试在没有 CUDA 的机器上跳过。"""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


TINY = dict(vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
            initializer_range=0.5, rms_norm_eps=1e-6)
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 256}


def make_tiny_model(kind: str, path: Path, seed: int = 0, **overrides) -> Path:
    """一个随机初始化的小模型目录：config.json + model.safetensors（fp32）+ 真实的 Qwen3 分词器。

    overrides 改写 config 的字段（比如 head_dim=128）：FlashInfer 这类 GPU kernel 只接受 64/128/256 的 head_dim。
    """
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    from minisgl.utils.hf import qwen3_tokenizer_dir

    if kind == "qwen3":  # head_dim 32 ≠ hidden/heads：检验显式 head_dim 的路径；共享词嵌入
        fields = dict(TINY, head_dim=32, tie_word_embeddings=True)
        config_cls, cls = Qwen3Config, Qwen3ForCausalLM
    elif kind == "llama":  # llama3 的 RoPE 缩放；不共享词嵌入
        fields = dict(TINY, rope_parameters=LLAMA3_ROPE, tie_word_embeddings=False)
        config_cls, cls = LlamaConfig, LlamaForCausalLM
    elif kind == "qwen3_moe":
        from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

        fields = dict(TINY, head_dim=32, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                      norm_topk_prob=True, decoder_sparse_step=1, tie_word_embeddings=False)
        config_cls, cls = Qwen3MoeConfig, Qwen3MoeForCausalLM
    else:
        raise ValueError(f"unknown tiny model kind {kind!r}")
    config = config_cls(**{**fields, **overrides})
    torch.manual_seed(seed)
    model = cls(config).to(torch.float32).eval()
    model.generation_config.eos_token_id = None  # 贪心对比时不要提前停
    model.generation_config.pad_token_id = None
    model.save_pretrained(path)
    for f in qwen3_tokenizer_dir().iterdir():
        shutil.copy(f, path / f.name)
    return path


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory) -> Path:
    return make_tiny_model("qwen3", tmp_path_factory.mktemp("tiny_qwen3"))


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    return make_tiny_model("llama", tmp_path_factory.mktemp("tiny_llama"))


@pytest.fixture(scope="session")
def tiny_qwen3_moe(tmp_path_factory) -> Path:
    return make_tiny_model("qwen3_moe", tmp_path_factory.mktemp("tiny_qwen3_moe"))


# 同样的结构，head_dim 换成 GPU 注意力 kernel（FlashInfer）接受的 64 / 128
@pytest.fixture(scope="session")
def tiny_qwen3_hd128(tmp_path_factory) -> Path:
    return make_tiny_model("qwen3", tmp_path_factory.mktemp("tiny_qwen3_hd128"), head_dim=128)


@pytest.fixture(scope="session")
def tiny_llama_hd64(tmp_path_factory) -> Path:  # hidden 256、4 个头 → head_dim 64，2 个 KV 头
    return make_tiny_model("llama", tmp_path_factory.mktemp("tiny_llama_hd64"), hidden_size=256,
                           num_attention_heads=4, num_key_value_heads=2)


@pytest.fixture(scope="session")
def tiny_qwen3_moe_hd128(tmp_path_factory) -> Path:
    return make_tiny_model("qwen3_moe", tmp_path_factory.mktemp("tiny_qwen3_moe_hd128"), head_dim=128)


@pytest.fixture(scope="session")
def tp1():
    """单进程的测试：TP 位置是 rank 0 / 共 1 个。构造层和模型的测试模块写 pytestmark = usefixtures("tp1")。"""
    from minisgl.distributed import set_tp_info

    return set_tp_info(0, 1)


@pytest.fixture(scope="session")
def smollm2() -> Path:
    from minisgl.utils.hf import default_model_path

    return default_model_path()


def mixed_workload(seed: int = 0, n: int = 64, vocab: int = 5000):
    """n 个长短不一的请求：奇数号的共享 4 个 24-token 前缀之一（前缀缓存能命中），各生成 1–10 个 token。"""
    import random

    from minisgl.core import SamplingParams

    rng = random.Random(seed)
    prefixes = [[rng.randrange(100, vocab) for _ in range(24)] for _ in range(4)]
    prompts, params = [], []
    for i in range(n):
        tail = [rng.randrange(100, vocab) for _ in range(rng.randint(1, 40))]
        prompts.append((prefixes[i % 4] if i % 2 else []) + tail)
        params.append(SamplingParams(max_tokens=rng.randint(1, 10), ignore_eos=True))
    return prompts, params


# 每个模型一起提交多少个请求（mixed_workload 的前 n 个）：SmolLM2 是真实权重，CPU 上每一步都要把 0.5 GB 权重读一遍，
# 单独跑一遍参照答案就要半分钟，所以它只跑前 32 个
NUM_REQUESTS = {"tiny_qwen3": 64, "smollm2": 32}


def generate_alone(path, prompts, params, **config):
    """参照答案：每个请求单独跑（一个请求槽、不复用前缀）。config 可以换设备（GPU 测试）。"""
    from minisgl.llm import LLM

    llm = LLM(path, **{"device": "cpu", **config}, max_running_req=1, cache_type="naive", num_pages=1024,
              max_seq_len_override=256)
    try:
        return [llm.generate([p], [s], use_tqdm=False)[0]["token_ids"] for p, s in zip(prompts, params)]
    finally:
        llm.shutdown()


def check_batched(path, prompts, params, ref, page_size: int = 1, **config) -> None:
    """一起提交，两轮，逐 token 等于参照；每轮之后资源全部回来；清空缓存后所有页空闲。"""
    from minisgl.llm import LLM

    llm = LLM(path, **{"device": "cpu", **config}, page_size=page_size, num_pages=4096 // page_size,
              max_running_req=64, max_seq_len_override=256)
    try:
        for _ in range(2):  # 第二轮：第一轮的前缀已经在缓存里
            got = [o["token_ids"] for o in llm.generate(prompts, params, use_tqdm=False)]
            assert got == ref, [i for i, (g, r) in enumerate(zip(got, ref)) if g != r]
            assert llm.table.num_free == 64 and not llm.running
            llm.cache.check_integrity()
        if config.get("cache_type", "radix") == "radix":
            assert llm.cache.hit_tokens > 0, "the second round should hit the prefix cache"
        llm.cache.flush()
        assert len(llm.cache.free_pages) == llm.cache.num_pages, "flushing the cache frees every page"
    finally:
        llm.shutdown()


@pytest.fixture(scope="session")
def reference():
    """reference(path, n)：mixed_workload(n=n) 的每个请求单独跑出的 token（参照答案，同一个模型和 n 只算一次）。"""
    cache = {}

    def get(path, n: int = 64):
        if (path, n) not in cache:
            cache[path, n] = generate_alone(path, *mixed_workload(n=n))
        return cache[path, n]

    return get


def collecting_scheduler(config):
    """一个收下所有回复的调度器：.replies 是全部回复，.finished() 是 uid → 结束原因（同一个请求结束两次就失败）。"""
    from minisgl.scheduler import Scheduler

    class Collect(Scheduler):
        def __init__(self) -> None:
            super().__init__(config)
            self.replies = []

        def send_result(self, replies) -> None:
            self.replies.extend(replies)

        def finished(self) -> dict:
            done = {}
            for r in self.replies:
                if r.finished:
                    assert r.uid not in done, f"request {r.uid} finished twice"
                    done[r.uid] = r.finish_reason
            return done

    return Collect()
