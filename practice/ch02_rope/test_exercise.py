"""ch02_rope 的测试。被测模块固定叫 solution（judge 会把你的代码放成 solution.py）。"""
import math

import pytest
import torch

from solution import apply_rope, default_inv_freq, llama3_inv_freq


def hf_config(rope_parameters, head_dim, n_heads=2):
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=n_heads * head_dim, num_attention_heads=n_heads, head_dim=head_dim,
                       max_position_embeddings=4096, rope_parameters=rope_parameters)


def hf_inv_freq(rope_parameters, head_dim):
    """transformers 自己算的 inv_freq（default 或 llama3），float32。"""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    return LlamaRotaryEmbedding(hf_config(rope_parameters, head_dim)).inv_freq.float()


def hf_rope(q, positions, rope_parameters, head_dim):
    """transformers 自己的实现：从同一组 RoPE 参数算 cos/sin，再旋转 q（[T, N, D]）。"""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    cos, sin = LlamaRotaryEmbedding(hf_config(rope_parameters, head_dim, q.shape[1]))(q, positions[None])
    out, _ = apply_rotary_pos_emb(q.transpose(0, 1)[None], q.transpose(0, 1)[None], cos, sin)
    return out[0].transpose(0, 1)


POSITIONS = torch.tensor([0, 1, 2, 17, 511, 512, 2000, 4095])


def _rotate(x, positions, inv_freq, adjacent=False, sign=1.0):
    """测试自己的 RoPE（float64），用来给错误的结果找原因：adjacent=True 是相邻两维配对，sign=-1 是反方向转。"""
    half = inv_freq.shape[0]
    ang = positions.double()[:, None, None] * inv_freq.double()
    cos, sin = ang.cos(), sign * ang.sin()
    x = x.double()
    out = x.clone()
    i1, i2 = (slice(0, 2 * half, 2), slice(1, 2 * half, 2)) if adjacent else (slice(0, half), slice(half, 2 * half))
    out[..., i1] = x[..., i1] * cos - x[..., i2] * sin
    out[..., i2] = x[..., i2] * cos + x[..., i1] * sin
    return out


def check_rope(got, x, positions, inv_freq, hf_inv, ref, per_position):
    """got（用 inv_freq 旋转 x 的结果）与 transformers 的 ref（用 hf_inv）比：位置 p 上允许 1e-5 + per_position·p 的绝对误差。
    不对时说出最像的原因（配对方式、旋转方向、θ、角度精度），而不是只给一句 "not close"。"""
    assert isinstance(got, torch.Tensor), f"apply_rope 应返回 torch.Tensor，得到 {type(got).__name__}"
    assert got.shape == ref.shape, f"形状应为 {tuple(ref.shape)}，得到 {tuple(got.shape)}"
    assert got.dtype == ref.dtype, f"dtype 应为 {ref.dtype}（和 x 相同），得到 {got.dtype}"
    tol = 1e-5 + per_position * positions.double()[:, None, None]
    diff = (got.double() - ref.double()).abs()
    if not torch.isnan(got).any() and (diff <= tol).all():
        return

    def near(**kw):  # 宽松地比：只用来猜原因（float32 的角度在位置 4095 上本身就有 1e-4 量级的舍入）
        try:
            other = _rotate(x, positions, inv_freq, **kw)
            return bool(((got.double() - other).abs() <= 1e-3 + 1e-5 * positions.double()[:, None, None]).all())
        except Exception:  # inv_freq 的形状不对之类：猜不出来，就不猜
            return False

    if near(adjacent=True):
        pytest.fail("结果是相邻两维配对（x[..., 0::2] 配 x[..., 1::2]）：Hugging Face 的检查点要前一半配后一半"
                    "（x[..., :R/2] 配 x[..., R/2:R]）", pytrace=False)
    if near(sign=-1.0):
        pytest.fail("旋转方向反了：应是 x1·cos − x2·sin 与 x2·cos + x1·sin", pytrace=False)
    bad = (diff > tol) | torch.isnan(got)
    t, n, d = (int(i) for i in bad.nonzero()[0])
    same_shape = isinstance(inv_freq, torch.Tensor) and inv_freq.shape == hf_inv.shape
    theta_rel = float(((inv_freq.double() - hf_inv.double()).abs() / hf_inv.double()).max()) if same_shape else 0.0
    hint = ""
    if not same_shape:
        hint = "；θ 的形状和 transformers 的不同：先让 inv_freq 的测试通过"
    elif not theta_rel <= 1e-5:  # not <=：NaN 也算
        hint = f"；θ 和 transformers 的最多差 {theta_rel:.1e}（相对）：先让 inv_freq 的测试通过"
    elif near():
        hint = "；旋转对，差在舍入：角度要在 float32 里算（positions.float()[:, None] * inv_freq）"
    pytest.fail(f"位置 {int(positions[t])}、头 {n}、第 {d} 维：得到 {float(got[t, n, d]):.6g}，transformers 是 "
                f"{float(ref[t, n, d]):.6g}（差 {float(diff[t, n, d]):.1e}，允许 {float(tol[t, 0, 0]):.1e}）{hint}",
                pytrace=False)


def check_inv_freq(got, expected, what, rtol=1e-5):
    """θ 按相对误差比：不同的写法（float64 再转 float32、exp/log、Python 的 **）和 transformers 只差几个 ulp。"""
    assert isinstance(got, torch.Tensor), f"{what} 应返回 torch.Tensor，得到 {type(got).__name__}"
    assert got.dtype == torch.float32, f"{what} 应返回 float32，得到 {got.dtype}"
    assert got.shape == expected.shape, f"{what} 的形状应为 {tuple(expected.shape)}，得到 {tuple(got.shape)}"
    rel = ((got.double() - expected.double()).abs() / expected.double()).nan_to_num(nan=float("inf"))
    i = int(rel.argmax())
    assert rel[i] <= rtol, (f"{what} 的第 {i} 个：得到 {float(got[i]):.8g}，transformers 是 {float(expected[i]):.8g}"
                            f"（相对差 {float(rel[i]):.1e}，允许 {rtol:g}）")


def test_default_inv_freq_values():
    f = default_inv_freq(8, 10000.0)
    assert f.dtype == torch.float32 and f.shape == (4,)
    expected = [1.0, 10000 ** -0.25, 10000 ** -0.5, 10000 ** -0.75]
    assert f.tolist() == pytest.approx(expected, rel=1e-6)


def test_default_inv_freq_rejects_odd_dim():
    with pytest.raises(ValueError):
        default_inv_freq(7, 10000.0)
    with pytest.raises(ValueError):
        default_inv_freq(0, 10000.0)


@pytest.mark.parametrize("head_dim,base", [(64, 1e6), (80, 1e6), (128, 1e4), (128, 5e5)])
def test_default_inv_freq_matches_transformers(head_dim, base):
    expected = hf_inv_freq({"rope_type": "default", "rope_theta": base}, head_dim)
    check_inv_freq(default_inv_freq(head_dim, base), expected, f"default_inv_freq({head_dim}, {base:g})")


LLAMA3_BANDS = [(1.0, 4.0), (0.5, 8.0), (2.0, 2.0001)]  # 最后一组的中频带极窄（high − low = 1e-4）


def llama3_params(low, high, original=512):
    return {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": low,
            "high_freq_factor": high, "original_max_position_embeddings": original}


@pytest.mark.parametrize("low,high", LLAMA3_BANDS)
def test_llama3_inv_freq_matches_transformers(low, high):
    # 输入用 transformers 自己的 default inv_freq：这里只考 llama3 的缩放
    base = hf_inv_freq({"rope_type": "default", "rope_theta": 5e5}, 128)
    got = llama3_inv_freq(base, 8.0, low, high, 512)
    check_inv_freq(got, hf_inv_freq(llama3_params(low, high), 128), f"llama3_inv_freq(low={low:g}, high={high:g})")


@pytest.mark.parametrize("head_dim", [64, 80, 128])
def test_apply_rope_matches_transformers(head_dim):
    # inv_freq 用 transformers 自己的：只考旋转，所以要逐位一致（绝对误差 1e-5）
    torch.manual_seed(0)
    q = torch.randn(len(POSITIONS), 3, head_dim)
    params = {"rope_type": "default", "rope_theta": 1e6}
    inv = hf_inv_freq(params, head_dim)
    check_rope(apply_rope(q, POSITIONS, inv), q, POSITIONS, inv, inv, hf_rope(q, POSITIONS, params, head_dim), 0.0)


# 端到端（你的 θ + 你的旋转）：θ 差一个 ulp，乘上位置 4095 后角度就差 1e-4 量级，所以允许的误差随位置增长
PER_POSITION = 1e-5


@pytest.mark.parametrize("head_dim", [64, 80, 128])
def test_default_matches_transformers(head_dim):
    torch.manual_seed(0)
    q = torch.randn(len(POSITIONS), 3, head_dim)
    params = {"rope_type": "default", "rope_theta": 1e6}
    inv = default_inv_freq(head_dim, 1e6)
    ref = hf_rope(q, POSITIONS, params, head_dim)
    check_rope(apply_rope(q, POSITIONS, inv), q, POSITIONS, inv, hf_inv_freq(params, head_dim), ref, PER_POSITION)


@pytest.mark.parametrize("low,high", LLAMA3_BANDS)
def test_llama3_matches_transformers(low, high):
    torch.manual_seed(1)
    head_dim = 64
    q = torch.randn(len(POSITIONS), 2, head_dim)
    inv = llama3_inv_freq(default_inv_freq(head_dim, 5e5), 8.0, low, high, 512)
    params = llama3_params(low, high)
    ref = hf_rope(q, POSITIONS, params, head_dim)
    check_rope(apply_rope(q, POSITIONS, inv), q, POSITIONS, inv, hf_inv_freq(params, head_dim), ref, PER_POSITION)


def test_llama3_frequency_bands():
    inv = default_inv_freq(128, 5e5)
    out = llama3_inv_freq(inv, 8.0, 1.0, 4.0, 8192)
    wavelen = 2 * math.pi / inv
    high = wavelen < 8192 / 4
    low = wavelen > 8192 / 1
    assert torch.equal(out[high], inv[high])                           # 高频不动
    torch.testing.assert_close(out[low], inv[low] / 8.0, atol=0, rtol=0)  # 低频除以 factor
    mid = ~(high | low)
    assert mid.any() and ((out[mid] < inv[mid]) & (out[mid] > inv[mid] / 8.0)).all()  # 中频在两者之间


def test_position_zero_is_identity_and_norm_preserved():
    torch.manual_seed(2)
    x = torch.randn(4, 2, 16)
    inv = default_inv_freq(16, 10000.0)
    out = apply_rope(x, torch.tensor([0, 0, 0, 0]), inv)
    torch.testing.assert_close(out, x, atol=1e-7, rtol=0)
    out = apply_rope(x, torch.tensor([3, 50, 700, 9999]), inv)
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1), atol=1e-5, rtol=1e-5)


def test_pairs_first_half_with_second_half():
    # 只有第 0 维是 1：旋转后能量只能出现在第 0 维和第 D/2 维（不是第 1 维）
    x = torch.zeros(1, 1, 8)
    x[0, 0, 0] = 1.0
    out = apply_rope(x, torch.tensor([1]), default_inv_freq(8, 10000.0))[0, 0]
    where = f"x = e_0、位置 1，旋转后是 {[round(v, 4) for v in out.tolist()]}"
    assert out[1] == 0 and out[5] == 0, f"{where}：第 1 维应为 0，像是相邻两维配对（应前一半配后一半：第 0 维配第 4 维）"
    assert out[0] == pytest.approx(math.cos(1.0), abs=1e-6), f"{where}：第 0 维应为 cos(1)"
    assert out[4] == pytest.approx(math.sin(1.0), abs=1e-6), f"{where}：第 4 维（D/2）应为 sin(1)"


def test_scores_depend_only_on_relative_position():
    torch.manual_seed(3)
    q, k = torch.randn(1, 1, 32), torch.randn(1, 1, 32)
    inv = default_inv_freq(32, 10000.0)

    def score(pq, pk):
        return float((apply_rope(q, torch.tensor([pq]), inv) * apply_rope(k, torch.tensor([pk]), inv)).sum())

    assert score(10, 7) == pytest.approx(score(3, 0), abs=1e-4)
    assert score(1003, 1000) == pytest.approx(score(3, 0), abs=1e-3)
    assert score(5, 0) != pytest.approx(score(3, 0), abs=1e-3)


def test_partial_rotary_and_dtype():
    torch.manual_seed(4)
    x = torch.randn(3, 2, 64, dtype=torch.bfloat16)
    x0 = x.clone()
    out = apply_rope(x, torch.tensor([0, 5, 9]), default_inv_freq(32, 10000.0))
    assert out.dtype == torch.bfloat16 and out.shape == x.shape
    assert torch.equal(out[..., 32:], x[..., 32:])  # 后 D-R 维原样保留
    assert not torch.equal(out[1:, :, :32], x[1:, :, :32])
    assert torch.equal(x, x0)  # 没有原地改输入
