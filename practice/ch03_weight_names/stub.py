"""第 3 章练习：权重名映射与 q/k/v、gate/up 合并。

把下面每个 `raise NotImplementedError(...)` 换成你的实现。要求见同目录的 README.md。
"""
from __future__ import annotations

from typing import Dict, List, Tuple

Matrix = List[List[float]]  # 每个内层列表是一行


def map_name(name: str) -> Tuple[str, int, int]:
    """HF 参数名 → (minisgl 参数名, 段号, 段数)；不合并的名字返回 (name, 0, 1)。"""
    raise NotImplementedError("实现 map_name：按 '.' 切开，逐段比较")


def load_checkpoint(tensors: List[Tuple[str, Matrix]], expected: Dict[str, Tuple[int, int]],
                    tie_word_embeddings: bool) -> Dict[str, Matrix]:
    """映射名字、合并分组、跳过不需要的张量，并检查结果与 expected 的名字和形状完全一致。"""
    raise NotImplementedError("实现 load_checkpoint")
