"""附录练习：词表掩码。

把下面每个 `raise NotImplementedError(...)` 换成你的实现。要求见同目录的 README.md。
可以自由添加辅助函数；下面几个函数的名字和参数不能改。
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Set

NEG_INF = float("-inf")


def pack_mask(allowed: Iterable[int], vocab_size: int) -> List[int]:
    """允许的 token id → ceil(vocab_size / 32) 个有符号 32 位整数（token j 是第 j // 32 个字的第 j % 32 位）。"""
    raise NotImplementedError("实现 pack_mask")


def apply_mask(logits: List[float], words: List[int]) -> List[float]:
    """返回新列表：位为 0 的 token 的 logit 换成 -inf，其余不变。"""
    raise NotImplementedError("实现 apply_mask")


def walk(transitions: Dict[int, Dict[str, int]], state: int, text: str) -> int | None:
    """从 state 出发逐个字符走 text；走到死（没有这条边）返回 None，否则返回最后的状态。"""
    raise NotImplementedError("实现 walk")


def dfa_token_mask(vocab: List[str], transitions: Dict[int, Dict[str, int]], accepting: Set[int], state: int,
                   eos_id: int) -> List[int]:
    """DFA 停在 state 时，下一个 token 的掩码：非空、整段都能走通的 token 允许；eos 只在 state 是接受状态时允许。"""
    raise NotImplementedError("实现 dfa_token_mask")

