def admit(queue, *, page_size, free_pages, evictable_pages, reserved_pages, free_slots, budget):
    """返回 (接纳的 uid 列表, 接纳之后的 reserved_pages)。"""
    raise NotImplementedError
