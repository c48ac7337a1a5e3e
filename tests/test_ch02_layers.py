# Tangled from book/chapters/ch02_layers.ipynb — edit the notebook, not this file.
"""第 2 章：layers/ 的每个算子都等于 transformers 里对应的实现（float32，随机输入）。"""
import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding,
                                                      apply_rotary_pos_emb)

from minisgl.layers import (BaseOP, LinearColParallelMerged, LinearQKVMerged, LinearReplicated, LinearRowParallel,
                            OPList, ParallelLMHead, RMSNorm, RMSNormFused, StateLessOP, VocabParallelEmbedding,
                            get_rope, silu_and_mul)
from minisgl.utils import torch_dtype

pytestmark = pytest.mark.usefixtures("tp1")  # 单进程：第 5 章的层按 TP 位置切分
ATOL = 1e-5


SCALINGS = {
    "default": None,
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 512},
    "llama3_sharp": {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 2.0, "high_freq_factor": 2.0001,
                     "original_max_position_embeddings": 512},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512},
    "yarn_options": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 512,
                     "beta_fast": 16, "beta_slow": 2, "mscale": 1.0, "mscale_all_dim": 0.5, "truncate": False},
    "yarn_attention_factor": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512,
                              "attention_factor": 0.8},
}


@pytest.mark.parametrize("head_dim", [64, 80, 128])
@pytest.mark.parametrize("name", list(SCALINGS))
def test_rope_matches_transformers(name: str, head_dim: int) -> None:
    torch.manual_seed(0)
    scaling, base, H, Hkv = SCALINGS[name], 1e6, 4, 2
    params = {**(scaling or {"rope_type": "default"}), "rope_theta": base}
    cfg = LlamaConfig(hidden_size=H * head_dim, num_attention_heads=H, num_key_value_heads=Hkv, head_dim=head_dim,
                      max_position_embeddings=4096, rope_parameters=params)
    positions = torch.tensor([0, 1, 5, 511, 512, 1000, 4095])
    q, k = torch.randn(len(positions), H, head_dim), torch.randn(len(positions), Hkv, head_dim)
    cos, sin = LlamaRotaryEmbedding(cfg)(q, positions[None])
    ref_q, ref_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    got_q, got_k = get_rope(head_dim, head_dim, 4096, base, scaling).forward(positions, q, k)
    torch.testing.assert_close(got_q, ref_q[0].transpose(0, 1), atol=ATOL, rtol=0)
    torch.testing.assert_close(got_k, ref_k[0].transpose(0, 1), atol=ATOL, rtol=0)


def test_rope_rejects_unknown_scaling() -> None:
    with pytest.raises(ValueError, match="longrope"):
        get_rope(64, 64, 4096, 1e4, {"rope_type": "longrope", "factor": 2.0})
    with pytest.raises(ValueError, match="rotary_dim"):
        get_rope(64, 63, 4096, 1e4)


def test_partial_rotary_keeps_the_rest() -> None:
    q, k = torch.randn(3, 2, 64), torch.randn(3, 2, 64)
    rq, rk = get_rope(64, 32, 4096, 1e4).forward(torch.tensor([0, 7, 9]), q, k)
    assert torch.equal(rq[..., 32:], q[..., 32:]) and torch.equal(rk[..., 32:], k[..., 32:])
    full_q, _ = get_rope(32, 32, 4096, 1e4).forward(torch.tensor([0, 7, 9]), q[..., :32], k[..., :32])
    torch.testing.assert_close(rq[..., :32], full_q, atol=0, rtol=0)


def _hf_norm(size: int, eps: float) -> LlamaRMSNorm:
    norm = LlamaRMSNorm(size, eps=eps)
    norm.weight.data.normal_()
    return norm


@pytest.mark.parametrize("shape", [(5, 64), (5, 4, 32)])
def test_rmsnorm_matches_transformers(shape) -> None:
    torch.manual_seed(0)
    ref = _hf_norm(shape[-1], 1e-6)
    norm = RMSNorm(shape[-1], 1e-6)
    norm.load_state_dict({"weight": ref.weight.detach()})
    x = torch.randn(shape) * 3
    torch.testing.assert_close(norm.forward(x), ref(x).detach(), atol=ATOL, rtol=0)


def test_rmsnorm_bf16_matches_transformers_bitwise() -> None:
    torch.manual_seed(0)
    ref = _hf_norm(64, 1e-6).to(torch.bfloat16)
    with torch_dtype(torch.bfloat16):
        norm = RMSNorm(64, 1e-6)
    norm.load_state_dict({"weight": ref.weight.detach()})
    x = (torch.randn(50, 64) * 3).to(torch.bfloat16)
    assert torch.equal(norm.forward(x), ref(x).detach())  # 同样的运算顺序：先转回 bf16 再乘权重


def test_rmsnorm_fused_adds_residual_first() -> None:
    torch.manual_seed(0)
    ref = _hf_norm(64, 1e-5)
    fused = RMSNormFused(64, 1e-5)
    fused.load_state_dict({"weight": ref.weight.detach()})
    x, residual = torch.randn(6, 64), torch.randn(6, 64)
    y, h = fused.forward(x)  # 第一层：没有残差，x 就是残差
    torch.testing.assert_close(y, ref(x).detach(), atol=ATOL, rtol=0)
    assert torch.equal(h, x)
    y, h = fused.forward(x, residual)
    torch.testing.assert_close(h, x + residual, atol=0, rtol=0)
    torch.testing.assert_close(y, ref(x + residual).detach(), atol=ATOL, rtol=0)


def test_merged_linears_equal_separate_ones() -> None:
    torch.manual_seed(0)
    E, D, H, Hkv = 32, 8, 4, 2
    q, k, v = (torch.nn.Linear(E, n * D, bias=True) for n in (H, Hkv, Hkv))
    qkv = LinearQKVMerged(E, D, H, Hkv, bias=True)
    qkv.load_state_dict({"weight": torch.cat([q.weight, k.weight, v.weight]).detach(),
                         "bias": torch.cat([q.bias, k.bias, v.bias]).detach()})
    x = torch.randn(5, E)
    got = qkv.forward(x).split([H * D, Hkv * D, Hkv * D], dim=-1)
    for out, ref in zip(got, (q, k, v)):
        torch.testing.assert_close(out, ref(x).detach(), atol=ATOL, rtol=0)
    for cls in (LinearReplicated, LinearRowParallel):
        lin, ref = cls(E, 16), torch.nn.Linear(E, 16, bias=False)
        assert lin.bias is None and list(lin.state_dict()) == ["weight"]
        lin.load_state_dict({"weight": ref.weight.detach()})
        torch.testing.assert_close(lin.forward(x), ref(x).detach(), atol=ATOL, rtol=0)


def test_swiglu_mlp_matches_transformers() -> None:
    torch.manual_seed(0)
    E, I = 48, 96
    ref = LlamaMLP(LlamaConfig(hidden_size=E, intermediate_size=I, num_attention_heads=4))
    gate_up, down = LinearColParallelMerged(E, [I, I]), LinearRowParallel(I, E)
    gate_up.load_state_dict({"weight": torch.cat([ref.gate_proj.weight, ref.up_proj.weight]).detach()})
    down.load_state_dict({"weight": ref.down_proj.weight.detach()})
    x = torch.randn(7, E)
    got = down.forward(silu_and_mul(gate_up.forward(x)))
    torch.testing.assert_close(got, ref(x).detach(), atol=ATOL, rtol=0)


def test_embedding_and_lm_head() -> None:
    torch.manual_seed(0)
    ref = torch.nn.Embedding(100, 16)
    emb = VocabParallelEmbedding(100, 16)
    emb.load_state_dict({"weight": ref.weight.detach()})
    ids = torch.tensor([0, 5, 99, 5])
    assert torch.equal(emb.forward(ids), ref(ids).detach())
    x = torch.randn(4, 16)
    head = ParallelLMHead(100, 16)
    head.load_state_dict({"weight": ref.weight.detach() * 2})
    torch.testing.assert_close(head.forward(x), x @ (ref.weight.detach() * 2).T, atol=ATOL, rtol=0)
    tied = ParallelLMHead(100, 16, tie_word_embeddings=True, tied_embedding=emb)
    assert tied.state_dict() == {}  # 绑定时权重只属于词嵌入
    emb.load_state_dict({"weight": ref.weight.detach() * 3})  # 换掉词嵌入的张量，输出头跟着变
    torch.testing.assert_close(tied.forward(x), x @ emb.weight.T, atol=0, rtol=0)
    with pytest.raises(ValueError):
        ParallelLMHead(100, 16, tie_word_embeddings=True)


class _Block(BaseOP):
    def __init__(self) -> None:
        self.norm = RMSNorm(4, 1e-6)
        self.proj = LinearReplicated(4, 3, bias=True)
        self.layers = OPList([RMSNorm(4, 1e-6), RMSNorm(4, 1e-6)])
        self.rope = get_rope(4, 4, 16, 1e4)  # StateLessOP：没有参数
        self.scale = 2.0  # 不是张量：不算参数
        self._cache = torch.zeros(3)  # 下划线开头：不算参数


def test_state_dict_names() -> None:
    assert isinstance(_Block().rope, StateLessOP)
    assert list(_Block().state_dict(prefix="model")) == [
        "model.norm.weight", "model.proj.weight", "model.proj.bias", "model.layers.0.weight", "model.layers.1.weight"]


def test_load_state_dict_checks_names_and_shapes() -> None:
    block = _Block()
    good = {name: torch.full(t.shape, 0.5, dtype=torch.float64) for name, t in block.state_dict().items()}
    block.load_state_dict(good)
    assert block.layers[1].weight.dtype == torch.float32  # 转成占位张量的 dtype
    assert torch.equal(block.proj.bias, torch.full((3,), 0.5))
    with pytest.raises(KeyError, match="proj.bias"):  # 缺了一个
        block.load_state_dict({k: v for k, v in good.items() if k != "proj.bias"})
    with pytest.raises(KeyError, match="extra.weight"):  # 多了一个
        block.load_state_dict({**good, "extra.weight": torch.zeros(1)})
    bad = {**good, "proj.weight": torch.zeros(4, 3)}
    with pytest.raises(ValueError, match="proj.weight"):  # 形状不对
        block.load_state_dict(bad)
    assert torch.equal(block.proj.weight, torch.full((3, 4), 0.5))  # 出错时什么都没改
