"""附录练习：词表掩码（参考答案）。"""
from __future__ import annotations

from typing import Dict, Iterable, List, Set

NEG_INF = float("-inf")


def pack_mask(allowed: Iterable[int], vocab_size: int) -> List[int]:
    """允许的 token id → ceil(vocab_size / 32) 个有符号 32 位整数（token j 是第 j // 32 个字的第 j % 32 位）。"""
    if vocab_size < 1:
        raise ValueError(f"vocab_size={vocab_size} must be >= 1")
    words = [0] * ((vocab_size + 31) // 32)
    for token in allowed:
        if not 0 <= token < vocab_size:
            raise ValueError(f"token {token} is outside the vocabulary [0, {vocab_size})")
        words[token // 32] |= 1 << (token % 32)
    return [w - (1 << 32) if w >= 1 << 31 else w for w in words]


def apply_mask(logits: List[float], words: List[int]) -> List[float]:
    """返回新列表：位为 0 的 token 的 logit 换成 -inf，其余不变。"""
    if len(words) != (len(logits) + 31) // 32:
        raise ValueError(f"{len(words)} words cannot mask {len(logits)} logits: need {(len(logits) + 31) // 32}")
    return [x if (words[j // 32] >> (j % 32)) & 1 else NEG_INF for j, x in enumerate(logits)]


def walk(transitions: Dict[int, Dict[str, int]], state: int, text: str) -> int | None:
    """从 state 出发逐个字符走 text；走到死（没有这条边）返回 None，否则返回最后的状态。"""
    for ch in text:
        nxt = transitions.get(state, {}).get(ch)
        if nxt is None:
            return None
        state = nxt
    return state


def dfa_token_mask(vocab: List[str], transitions: Dict[int, Dict[str, int]], accepting: Set[int], state: int,
                   eos_id: int) -> List[int]:
    """DFA 停在 state 时，下一个 token 的掩码：非空、整段都能走通的 token 允许；eos 只在 state 是接受状态时允许。"""
    allowed = [i for i, text in enumerate(vocab)
               if i != eos_id and text and walk(transitions, state, text) is not None]
    if state in accepting:
        allowed.append(eos_id)
    return pack_mask(allowed, len(vocab))
