def admit(queue, *, page_size, free_pages, evictable_pages, reserved_pages, free_slots, budget):
    """返回 (接纳的 uid 列表, 接纳之后的 reserved_pages)。"""
    args = dict(page_size=page_size, free_pages=free_pages, evictable_pages=evictable_pages,
                reserved_pages=reserved_pages, free_slots=free_slots, budget=budget)
    for name, value in args.items():
        if value < (1 if name == "page_size" else 0):
            raise ValueError(f"{name}={value} is invalid")
    admitted = []
    for req in queue:
        if free_slots == 0:
            break
        extend = req["prompt_len"] - req["cached"]
        if admitted and extend > budget:
            break
        locked = req["cached"] // page_size  # 命中的整页：锁住后不再可淘汰
        total = -(-(req["prompt_len"] + req["max_tokens"]) // page_size)
        need = total - locked
        if need > free_pages + (evictable_pages - locked) - reserved_pages:
            break  # 队头放不下：停下，不跳过它
        evictable_pages -= locked
        reserved_pages += need
        free_slots -= 1
        budget -= extend
        admitted.append(req["uid"])
    return admitted, reserved_pages
