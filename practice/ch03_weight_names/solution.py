"""第 3 章练习的参考答案：权重名映射与 q/k/v、gate/up 合并。"""
from __future__ import annotations

from typing import Dict, List, Tuple

Matrix = List[List[float]]  # 每个内层列表是一行

_MERGED = {
    "q_proj": ("qkv_proj", 0, 3),
    "k_proj": ("qkv_proj", 1, 3),
    "v_proj": ("qkv_proj", 2, 3),
    "gate_proj": ("gate_up_proj", 0, 2),
    "up_proj": ("gate_up_proj", 1, 2),
}


def map_name(name: str) -> Tuple[str, int, int]:
    """HF 参数名 → (minisgl 参数名, 段号, 段数)；不合并的名字返回 (name, 0, 1)。"""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part in _MERGED:
            merged, slot, count = _MERGED[part]
            return ".".join(parts[:i] + [merged] + parts[i + 1:]), slot, count
    return name, 0, 1


def _shape(m: Matrix) -> Tuple[int, int]:
    return len(m), (len(m[0]) if m else 0)


def load_checkpoint(tensors: List[Tuple[str, Matrix]], expected: Dict[str, Tuple[int, int]],
                    tie_word_embeddings: bool) -> Dict[str, Matrix]:
    """映射名字、合并分组、跳过不需要的张量，并检查结果与 expected 的名字和形状完全一致。"""
    out: Dict[str, Matrix] = {}
    pending: Dict[str, Dict[int, Matrix]] = {}
    for name, matrix in tensors:
        if name.endswith("rotary_emb.inv_freq") or (tie_word_embeddings and name.startswith("lm_head.")):
            continue
        merged, slot, count = map_name(name)
        if count > 1:
            group = pending.setdefault(merged, {})
            group[slot] = matrix
            if len(group) < count:
                continue
            del pending[merged]
            matrix = [row for i in range(count) for row in group[i]]
        if merged not in expected:
            raise KeyError(f"the checkpoint has {merged!r}, which the model does not have")
        if _shape(matrix) != tuple(expected[merged]):
            raise ValueError(f"{merged!r}: shape {_shape(matrix)} in the checkpoint, the model expects "
                             f"{tuple(expected[merged])}")
        out[merged] = matrix
    if pending:
        raise ValueError(f"the checkpoint has only some parts of {sorted(pending)}")
    missing = sorted(set(expected) - set(out))
    if missing:
        raise KeyError(f"the checkpoint lacks {missing}")
    return out
