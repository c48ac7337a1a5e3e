"""第 9 章练习：连续批处理的接纳（按估计的用量）与撤回。

把下面每个 `raise NotImplementedError(...)` 换成你的实现。要求见同目录的 README.md。
可以自由添加辅助函数；下面两个公开函数的名字和参数不能改。
"""
import math


def admit(queue, running, *, page_size, free_pages, evictable_pages, free_slots, budget, ratio):
    """返回这一步接纳的 uid 列表（按队列顺序）。"""
    raise NotImplementedError("实现 admit")


def retract(running, *, page_size, available_pages):
    """返回这一步要撤回的 uid（先撤的在前）。"""
    raise NotImplementedError("实现 retract")
