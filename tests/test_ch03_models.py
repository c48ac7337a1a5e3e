# Tangled from book/chapters/ch03_models.ipynb — edit the notebook, not this file.
"""第 3 章：Llama、Qwen3 的 logits 等于 transformers 的（float32），贪心生成的 token 逐个相同。"""
import dataclasses
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from minisgl.models import (MODELS, BaseLLMModel, ModelConfig, SimpleKVCache, create_model, greedy_generate,
                            init_dummy_weight, load_weight)
from minisgl.models.weight import map_weight_name, merge_weights
from minisgl.utils import torch_dtype
from minisgl.utils.hf import load_hf_config

pytestmark = pytest.mark.usefixtures("tp1")  # 单进程
PROMPT = [9707, 11, 847, 829, 374, 11097, 13, 3555, 374, 279, 6722, 315, 9625, 30]  # Qwen3 分词器的一句话


def all_logits(model: BaseLLMModel, ids: torch.Tensor, positions: torch.Tensor, kv_cache: SimpleKVCache):
    """每个位置的 logits [T, V]（model.forward 只给最后一个位置的）：和 transformers 逐位置对拍用。"""
    return model.lm_head.forward(model.model.forward(ids, positions, kv_cache))


def load_both(path: Path):
    """同一份权重：transformers 的模型和 minisgl 的模型，都是 float32、CPU。"""
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None  # 贪心对比时不要提前停
    hf.generation_config.pad_token_id = None
    with torch.device("cpu"):
        ours = create_model(ModelConfig.from_hf(load_hf_config(path)))
    load_weight(ours, path)
    return hf, ours


def first_diff(a, b) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


@pytest.mark.parametrize("fixture, atol", [("tiny_qwen3", 1e-4), ("tiny_llama", 1e-4), ("tiny_llama_hd64", 1e-3)])
def test_tiny_models_match_transformers(fixture: str, atol: float, request) -> None:
    hf, ours = load_both(request.getfixturevalue(fixture))
    ids = torch.tensor(PROMPT)
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]  # [T, V]
    kv_cache = SimpleKVCache(ours.config, len(PROMPT), ids.device, torch.float32)
    got = all_logits(ours, ids, torch.arange(len(PROMPT)), kv_cache)  # [T, V]
    torch.testing.assert_close(got, ref, atol=atol, rtol=1e-4)
    kv_cache = SimpleKVCache(ours.config, len(PROMPT), ids.device, torch.float32)
    last = ours.forward(ids, torch.arange(len(PROMPT)), kv_cache)  # forward 本身只给最后一个位置
    assert last.shape == (1, ours.config.vocab_size)
    torch.testing.assert_close(last, got[-1:], atol=1e-5, rtol=1e-5)  # 一行和 T 行的矩阵乘，舍入可以不同

    ref_tokens = hf.generate(ids[None], max_new_tokens=32, do_sample=False)[0, len(PROMPT):].tolist()
    got_tokens = greedy_generate(ours, PROMPT, max_new_tokens=32)
    assert got_tokens == ref_tokens, f"first divergence at step {first_diff(got_tokens, ref_tokens)}"
    assert len(set(ref_tokens)) > 4, "the oracle repeats one token: this test would catch nothing"


def test_prefill_in_chunks_equals_one_shot(tiny_llama: Path) -> None:
    """分几段 prefill（位置不从 0 开始）和一次 prefill 的 logits 相同：第 10 章的分块预填充靠的就是这一点。"""
    _, ours = load_both(tiny_llama)
    ids, T = torch.tensor(PROMPT), len(PROMPT)
    whole = all_logits(ours, ids, torch.arange(T), SimpleKVCache(ours.config, T, ids.device, torch.float32))
    kv = SimpleKVCache(ours.config, T, ids.device, torch.float32)
    parts = [all_logits(ours, ids[a:b], torch.arange(a, b), kv) for a, b in ((0, 5), (5, 6), (6, T))]
    torch.testing.assert_close(torch.cat(parts), whole, atol=1e-4, rtol=1e-4)


def test_greedy_generate_stops_and_checks(tiny_qwen3: Path) -> None:
    _, ours = load_both(tiny_qwen3)
    full = greedy_generate(ours, PROMPT, max_new_tokens=16)
    stop = full[5]
    assert greedy_generate(ours, PROMPT, 16, stop_token_ids=[stop]) == full[: full.index(stop) + 1]
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        greedy_generate(ours, [], 4)
    with torch.device("meta"):
        ghost = create_model(ours.config)
    with pytest.raises(ValueError, match="meta device"):
        load_weight(ghost, tiny_qwen3)


def test_init_dummy_weight_writes_every_parameter(tiny_qwen3: Path) -> None:
    config = ModelConfig.from_hf(load_hf_config(tiny_qwen3))
    models = [create_model(config) for _ in range(3)]
    for model in models:
        for tensor in model.state_dict().values():
            tensor.fill_(float("nan"))  # 没被写到的参数会一直是 NaN
    for model, seed in zip(models, (0, 0, 1)):
        init_dummy_weight(model, seed)
    a, b, c = (model.state_dict() for model in models)
    for name, t in a.items():
        if t.dim() == 1:  # 这些模型的一维参数都是 norm 的权重
            assert torch.equal(t, torch.ones_like(t)), name
        else:
            assert t.isfinite().all() and abs(t.std().item() - 0.02) < 0.002, name
            assert not torch.equal(t, c[name]), f"{name}: seed 1 gave the same values as seed 0"
        assert torch.equal(t, b[name]), f"{name}: two calls with seed 0 differ"
    with torch.device("meta"):
        ghost = create_model(config)
    with pytest.raises(ValueError, match="meta device"):
        init_dummy_weight(ghost)


def test_dummy_weights_keep_48_bf16_layers_finite(tiny_qwen3: Path) -> None:
    """Qwen3-30B-A3B 有 48 层：随机权重的 bf16 模型走完 48 层，logits 仍是有限的、不全相同的数。"""
    config = dataclasses.replace(ModelConfig.from_hf(load_hf_config(tiny_qwen3)), num_layers=48)
    with torch_dtype(torch.bfloat16):
        model = create_model(config)
    init_dummy_weight(model)
    ids = torch.tensor(PROMPT)
    logits = all_logits(model, ids, torch.arange(len(PROMPT)),
                        SimpleKVCache(config, len(PROMPT), ids.device, torch.bfloat16))  # [T, V] bf16
    assert logits.isfinite().all() and logits.float().std() > 0


def test_smollm2_matches_transformers(smollm2: Path) -> None:
    """真实的 135M 模型（bf16 检查点装进 float32 模型）：logits 与 32 个贪心 token。"""
    from minisgl.utils.hf import load_tokenizer

    hf, ours = load_both(smollm2)
    tok = load_tokenizer(smollm2)
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                     tokenize=False, add_generation_prompt=True)
    ids = torch.tensor(tok.encode(prompt))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    got = all_logits(ours, ids, torch.arange(len(ids)), SimpleKVCache(ours.config, len(ids), ids.device, torch.float32))
    torch.testing.assert_close(got, ref, atol=1e-3, rtol=1e-4)
    ref_tokens = hf.generate(ids[None], max_new_tokens=32, do_sample=False)[0, len(ids):].tolist()
    got_tokens = greedy_generate(ours, ids.tolist(), max_new_tokens=32)
    assert got_tokens == ref_tokens, f"first divergence at step {first_diff(got_tokens, ref_tokens)}"


def test_map_weight_name() -> None:
    assert map_weight_name("model.layers.7.self_attn.v_proj.weight") == ("model.layers.7.self_attn.qkv_proj.weight", 2, 3)
    assert map_weight_name("model.layers.0.mlp.gate_proj.weight") == ("model.layers.0.mlp.gate_up_proj.weight", 0, 2)
    assert map_weight_name("model.layers.0.self_attn.o_proj.weight") == ("model.layers.0.self_attn.o_proj.weight", 0, 1)
    assert map_weight_name("model.my_q_proj_table.weight") == ("model.my_q_proj_table.weight", 0, 1)


def test_merge_weights_in_any_order() -> None:
    q, k, v = torch.full((4, 2), 1.0), torch.full((2, 2), 2.0), torch.full((2, 2), 3.0)
    stream = [("a.self_attn.v_proj.weight", v), ("a.norm.weight", torch.ones(2)),
              ("a.self_attn.q_proj.weight", q), ("a.self_attn.k_proj.weight", k)]
    out = dict(merge_weights(iter(stream)))
    assert list(out) == ["a.norm.weight", "a.self_attn.qkv_proj.weight"]
    assert torch.equal(out["a.self_attn.qkv_proj.weight"], torch.cat([q, k, v]))
    with pytest.raises(ValueError, match="gate_up_proj"):
        dict(merge_weights(iter([("m.mlp.gate_proj.weight", q)])))


def test_sharded_checkpoint(tiny_llama: Path, tmp_path: Path) -> None:
    """把检查点拆成 3 个分片 + index.json：加载结果与单文件逐位相同。"""
    for f in tiny_llama.iterdir():
        if f.suffix != ".safetensors":
            (tmp_path / f.name).write_bytes(f.read_bytes())
    state = load_file(tiny_llama / "model.safetensors")
    names, weight_map = sorted(state), {}
    for i in range(3):
        file = f"model-{i + 1:05d}-of-00003.safetensors"
        part = {n: state[n] for n in names[i::3]}
        save_file(part, tmp_path / file)
        weight_map.update(dict.fromkeys(part, file))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    config = ModelConfig.from_hf(load_hf_config(tiny_llama))
    single, sharded = create_model(config), create_model(config)
    load_weight(single, tiny_llama)
    load_weight(sharded, tmp_path)
    a, b = single.state_dict(), sharded.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


def test_checkpoint_mismatch_is_named(tiny_qwen3: Path, tmp_path: Path) -> None:
    config = ModelConfig.from_hf(load_hf_config(tiny_qwen3))
    state = load_file(tiny_qwen3 / "model.safetensors")
    assert "lm_head.weight" not in state and config.tie_word_embeddings  # 共享词嵌入：检查点里没有 lm_head
    del state["model.layers.1.self_attn.k_norm.weight"]
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(KeyError, match="k_norm"):
        load_weight(create_model(config), tmp_path)
    state["model.layers.1.self_attn.k_norm.weight"] = torch.ones(config.head_dim)
    state["model.extra.weight"] = torch.ones(3)
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(KeyError, match="model.extra.weight"):
        load_weight(create_model(config), tmp_path)


def test_config_and_registry(tiny_qwen3: Path) -> None:
    hf = load_hf_config(tiny_qwen3)
    config = ModelConfig.from_hf(hf)
    assert (config.head_dim, config.num_qo_heads, config.num_kv_heads) == (32, 4, 2)  # head_dim ≠ 64/4
    assert config.rope_scaling is None and not config.is_moe
    assert set(MODELS.names()) >= {"LlamaForCausalLM", "Qwen3ForCausalLM"}
    with pytest.raises(ValueError, match="LlamaForCausalLM"):  # 报错里列出支持的名字
        create_model(dataclasses.replace(config, architecture="GPT2LMHeadModel"))
    hf.hidden_act = "gelu"
    with pytest.raises(ValueError, match="gelu"):
        ModelConfig.from_hf(hf)
    hf.hidden_act, hf.mlp_only_layers = "silu", [0]  # Qwen3-MoE 里夹着稠密层：还不支持，读配置时就报错
    with pytest.raises(ValueError, match="mlp_only_layers"):
        ModelConfig.from_hf(hf)
    hf.mlp_only_layers = []
    assert config.rotary_dim == config.head_dim
    hf.rope_parameters = {**hf.rope_parameters, "partial_rotary_factor": 0.5}  # transformers 的 Qwen3 不做部分旋转
    with pytest.raises(ValueError, match="partial_rotary_factor=0.5"):
        ModelConfig.from_hf(hf)


def test_one_rope_table_per_model(tiny_qwen3: Path) -> None:
    with torch.device("meta"):  # 只看结构：RoPE 表照样建在 CPU 上
        model = create_model(ModelConfig.from_hf(load_hf_config(tiny_qwen3)))
    rotaries = {id(layer.self_attn._rotary) for layer in model.model.layers}
    assert len(rotaries) == 1  # 所有层共用一个
    rope = model.model.layers[0].self_attn._rotary
    assert rope._cos_sin_cache.device.type == "cpu" and rope._cos_sin_cache.shape == (4096, 32)  # [P, R]
    assert not any("rotary" in name for name in model.state_dict())  # 不是参数


def load_on(path: Path, device: torch.device, dtype: torch.dtype):
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    hf.generation_config.eos_token_id = hf.generation_config.pad_token_id = None
    with torch.device(device), torch_dtype(dtype):
        ours = create_model(ModelConfig.from_hf(load_hf_config(path)))
    load_weight(ours, path)
    return hf, ours


def logits_of(hf, ours, device: torch.device, dtype: torch.dtype):
    ids = torch.tensor(PROMPT, device=device)
    with torch.no_grad():
        ref = hf(ids[None]).logits[0].float()  # [T, V]
    got = all_logits(ours, ids, torch.arange(len(PROMPT), device=device),
                     SimpleKVCache(ours.config, len(PROMPT), device, dtype)).float()  # [T, V]
    return ref, got


@pytest.mark.gpu
@pytest.mark.parametrize("fixture", ["tiny_qwen3", "tiny_llama"])
def test_cuda_float32_matches_transformers(fixture: str, request) -> None:
    device = torch.device("cuda")
    hf, ours = load_on(request.getfixturevalue(fixture), device, torch.float32)
    ref, got = logits_of(hf, ours, device, torch.float32)
    torch.testing.assert_close(got, ref, atol=1e-3, rtol=1e-3)
    ids = torch.tensor([PROMPT], device=device)
    ref_tokens = hf.generate(ids, max_new_tokens=32, do_sample=False)[0, len(PROMPT):].tolist()
    assert greedy_generate(ours, PROMPT, max_new_tokens=32) == ref_tokens


@pytest.mark.gpu
@pytest.mark.parametrize("fixture", ["tiny_qwen3", "tiny_llama"])
def test_cuda_bfloat16_is_as_accurate_as_transformers(fixture: str, request) -> None:
    path, device = request.getfixturevalue(fixture), torch.device("cuda")
    exact, _ = logits_of(*load_on(path, device, torch.float32), device, torch.float32)
    hf16, ours16 = logits_of(*load_on(path, device, torch.bfloat16), device, torch.bfloat16)
    err_hf, err_ours = (hf16 - exact).abs().max(), (ours16 - exact).abs().max()
    assert err_ours <= 2 * err_hf, f"bf16 error: ours {err_ours:.3f}, transformers {err_hf:.3f}"
    agree = (ours16.argmax(-1) == exact.argmax(-1)).float().mean()
    agree_hf = (hf16.argmax(-1) == exact.argmax(-1)).float().mean()
    assert agree >= agree_hf - 0.15, f"top-1 agreement with float32: ours {agree:.2f}, transformers {agree_hf:.2f}"
