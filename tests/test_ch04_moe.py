# Tangled from book/chapters/ch04_moe.ipynb — edit the notebook, not this file.
"""第 4 章：MoE 块等于 transformers 的 Qwen3MoeSparseMoeBlock；整个 Qwen3-MoE 的 logits 与贪心 token 逐个相同。"""
import random

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3MoeConfig
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

from minisgl.models import ModelConfig, SimpleKVCache, create_model, greedy_generate, load_weight
from minisgl.models.weight import stack_experts
from minisgl.moe import MOE_BACKENDS, MoELayer, create_moe_backend, select_experts
from minisgl.utils.hf import load_hf_config

pytestmark = pytest.mark.usefixtures("tp1")  # 单进程
PROMPT = [9707, 11, 847, 829, 374, 11097, 13, 3555, 374, 279, 6722, 315, 9625, 30]  # Qwen3 分词器的一句话


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
    assert "torch" in MOE_BACKENDS.names()
    with pytest.raises(ValueError, match="torch"):
        create_moe_backend("fused")
