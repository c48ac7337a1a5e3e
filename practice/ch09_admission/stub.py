def admit(queue, running, *, page_size, free_pages, evictable_pages, free_slots, budget, ratio):
    """返回这一步接纳的 uid 列表（按队列顺序）。"""
    raise NotImplementedError


def retract(running, *, page_size, available_pages):
    """返回这一步要撤回的 uid（先撤的在前）。"""
    raise NotImplementedError
