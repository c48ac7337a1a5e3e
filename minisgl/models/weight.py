# Tangled from book/chapters/ch03_models.ipynb and ch04_moe.ipynb and ch05_tensor_parallel.ipynb — edit the notebooks, not this file.
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Iterator, Tuple

import torch
from safetensors import safe_open
from tqdm import tqdm

from minisgl.distributed import DistributedInfo, get_tp_info, kv_head_range, shard_range, vocab_range
from minisgl.utils import div_ceil

if TYPE_CHECKING:
    from .config import ModelConfig
    from .utils import BaseLLMModel


# 检查点里分开存、模型里合并的投影：HF 名字里的一段 → (合并后的名字, 第几段, 共几段)
_MERGED = {
    "q_proj": ("qkv_proj", 0, 3),
    "k_proj": ("qkv_proj", 1, 3),
    "v_proj": ("qkv_proj", 2, 3),
    "gate_proj": ("gate_up_proj", 0, 2),
    "up_proj": ("gate_up_proj", 1, 2),
}
# 检查点里有、模型里不需要的张量（旧检查点存了 RoPE 的频率）
_SKIPPED_SUFFIXES = ("rotary_emb.inv_freq",)


def map_weight_name(name: str) -> Tuple[str, int, int]:
    """HF 参数名 → (minisgl 参数名, 段号, 段数)；不合并的名字原样返回，段号 0、段数 1。

    "model.layers.0.self_attn.k_proj.weight" → ("model.layers.0.self_attn.qkv_proj.weight", 1, 3)
    """
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part in _MERGED:
            merged, slot, count = _MERGED[part]
            return ".".join(parts[:i] + [merged] + parts[i + 1:]), slot, count
    return name, 0, 1


def read_checkpoint(model_path: Path | str) -> Iterator[Tuple[str, torch.Tensor]]:
    """逐个读出检查点里的 (名字, CPU 张量)，带一个 tqdm 进度条；分片的检查点按 index.json 找文件。"""
    folder = Path(model_path)
    index = folder / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {folder}")
    total = 0
    for file in files:  # 只读每个文件的 JSON 头，数一数张量
        with safe_open(folder / file, framework="pt") as f:
            total += len(f.keys())
    with tqdm(total=total, desc="Loading weights", unit="tensor", disable=not get_tp_info().is_primary()) as bar:
        for file in files:
            with safe_open(folder / file, framework="pt", device="cpu") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)
                    bar.update()


def merge_weights(tensors: Iterator[Tuple[str, torch.Tensor]]) -> Iterator[Tuple[str, torch.Tensor]]:
    """q/k/v、gate/up 攒齐后按行（输出维）拼成一个再交出；其他张量原样交出。"""
    pending: Dict[str, Dict[int, torch.Tensor]] = {}  # 合并后的名字 → {段号: 张量}，只放还没攒齐的组
    for name, tensor in tensors:
        merged, slot, count = map_weight_name(name)
        if count == 1:
            yield name, tensor
            continue
        group = pending.setdefault(merged, {})
        group[slot] = tensor
        if len(group) == count:
            del pending[merged]
            yield merged, torch.cat([group[i] for i in range(count)], dim=0)  # [Σ out_i, in]
    if pending:
        raise ValueError(f"the checkpoint has only some parts of {sorted(pending)}")


def checkpoint_tensors(model: BaseLLMModel, model_path: Path | str) -> Iterator[Tuple[str, torch.Tensor]]:
    """检查点 → (模型里的参数名, 张量) 的流：逐个读、切出本 rank 的一份、合并、堆叠专家。"""
    config, tp_info = model.config, get_tp_info()
    shards = ((name, shard_weight(name, t, config, tp_info)) for name, t in read_checkpoint(model_path))
    return stack_experts(merge_weights(shards), config.num_experts)


def load_weight(model: BaseLLMModel, model_path: Path | str) -> None:
    """把检查点流式装进 model：checkpoint_tensors 逐个交出张量，拷进模型已分配的参数（转成参数的 dtype 和 device）。"""
    params = model.state_dict()
    if any(t.is_meta for t in params.values()):  # meta 张量的 copy_ 什么也不做，也不报错
        raise ValueError(f"{type(model).__name__} was built on the meta device; build it inside "
                         "`with torch.device(...)` on a real device before load_weight")
    loaded = set()
    for name, tensor in checkpoint_tensors(model, model_path):
        if name not in params:
            if name.endswith(_SKIPPED_SUFFIXES) or (name.startswith("lm_head.") and model.config.tie_word_embeddings):
                continue  # 共享词嵌入的模型没有自己的 lm_head
            raise KeyError(f"{model_path}: the checkpoint has {name!r}, which {type(model).__name__} does not have")
        if tensor.shape != params[name].shape:
            raise ValueError(f"{model_path}: {name!r} has shape {tuple(tensor.shape)} in the checkpoint, "
                             f"the model expects {tuple(params[name].shape)}")
        params[name].copy_(tensor)
        loaded.add(name)
    missing = sorted(params.keys() - loaded)
    if missing:
        raise KeyError(f"{model_path}: the checkpoint lacks {len(missing)} tensors the model needs, e.g. {missing[:3]}")


def init_dummy_weight(model: BaseLLMModel, seed: int = 0) -> None:
    """不读检查点：把每个参数就地填成随机数，在参数自己所在的设备上生成。同一个 seed、同一个结构，结果逐位相同。

    矩阵（二维及以上）~ N(0, 0.02)；一维的 norm 权重填 1，其他一维张量（偏置）填 0。
    """
    params = model.state_dict()
    if any(t.is_meta for t in params.values()):
        raise ValueError(f"{type(model).__name__} was built on the meta device; build it inside "
                         "`with torch.device(...)` on a real device before init_dummy_weight")
    for i, name in enumerate(sorted(params)):  # 按名字排序编号：与 state_dict 的遍历顺序无关
        tensor = params[name]
        if tensor.dim() == 1:
            tensor.fill_(1.0 if "norm" in name else 0.0)
            continue
        gen = torch.Generator(device=tensor.device)
        gen.manual_seed(seed * 1_000_003 + i)  # 每个参数自己的随机数流：TP 的各个 rank 上，不切分的参数完全相同
        tensor.normal_(0.0, 0.02, generator=gen)


_EXPERT = re.compile(r"^(?P<prefix>.+\.experts)\.(?P<idx>\d+)\.(?P<name>\w+)\.weight$")


def stack_experts(tensors: Iterator[Tuple[str, torch.Tensor]],
                  num_experts: int) -> Iterator[Tuple[str, torch.Tensor]]:
    """"...experts.{e}.{name}.weight" 攒齐 E 个后堆成 "...experts.{name}"：[E, ...]；其他张量原样交出。"""
    pending: Dict[str, Dict[int, torch.Tensor]] = {}  # 堆叠后的名字 → {专家编号: 张量}
    for name, tensor in tensors:
        m = _EXPERT.match(name)
        if m is None:
            yield name, tensor
            continue
        stacked = f"{m['prefix']}.{m['name']}"
        group = pending.setdefault(stacked, {})
        group[int(m["idx"])] = tensor
        if len(group) == num_experts:
            del pending[stacked]
            yield stacked, torch.stack([group[e] for e in range(num_experts)])  # [E, out, in]
    if pending:
        raise ValueError(f"the checkpoint has only some experts of {sorted(pending)}")


_COLUMN = {"gate_proj", "up_proj"}  # 按输出维（行）切，专家的也一样
_ROW = {"o_proj", "down_proj"}  # 按输入维（列）切
_VOCAB = {"embed_tokens", "lm_head"}  # 按词表切，补齐到 ceil(V/tp) 行


def shard_weight(name: str, tensor: torch.Tensor, config: ModelConfig,
                 tp_info: DistributedInfo) -> torch.Tensor:
    """检查点里的一个完整张量 → 本 rank 的那一份（路由器、norm 之类不切的原样返回）。"""
    if tp_info.size == 1:
        return tensor
    parts, D = set(name.split(".")), config.head_dim
    if "q_proj" in parts:
        start, end = shard_range(config.num_qo_heads, tp_info, "num_attention_heads")
        return tensor[start * D:end * D].clone()  # [H/tp·D, E]
    if parts & {"k_proj", "v_proj"}:
        start, end = kv_head_range(config.num_kv_heads, tp_info)
        return tensor[start * D:end * D].clone()  # [Hkv/tp·D, E]
    if parts & _COLUMN:
        start, end = shard_range(tensor.shape[0], tp_info, name)
        return tensor[start:end].clone()  # [I/tp, E]
    if parts & _ROW:
        if tensor.dim() == 1:  # 行并行层的偏置不切：每个 rank 一份完整的，all-reduce 之后只加一次
            return tensor
        start, end = shard_range(tensor.shape[1], tp_info, name)
        return tensor[:, start:end].clone()  # [E, I/tp]
    if parts & _VOCAB:
        start, end = vocab_range(config.vocab_size, tp_info)
        out = tensor.new_zeros(div_ceil(config.vocab_size, tp_info.size), tensor.shape[1])  # [V/tp, E]
        out[:end - start] = tensor[start:end]
        return out
    return tensor
