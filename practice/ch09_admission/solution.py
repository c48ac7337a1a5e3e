"""第 9 章练习：连续批处理的接纳与撤回（参考答案）。"""

import math


def _pages(tokens, page_size):
    return math.ceil(tokens / page_size)


def admit(queue, running, *, page_size, free_pages, evictable_pages, free_slots, budget, ratio):
    """返回这一步接纳的 uid 列表（按队列顺序）。"""
    args = dict(page_size=page_size, free_pages=free_pages, evictable_pages=evictable_pages, free_slots=free_slots,
                budget=budget)
    for name, value in args.items():
        if value < (1 if name == "page_size" else 0):
            raise ValueError(f"{name}={value} is invalid")
    if not 0 <= ratio <= 1:
        raise ValueError(f"ratio={ratio} is invalid")
    committed = 0  # 运行中的请求估计还要的页
    for r in running:
        est = r["length"] + ratio * (r["final_len"] - r["length"])
        committed += max(0, _pages(est, page_size) - r["held_pages"])
    admitted = []
    for req in queue:
        if free_slots == 0:
            break
        extend = req["prompt_len"] - req["cached"]
        if admitted and extend > budget:
            break
        locked = req["cached"] // page_size  # 命中的整页：锁住后不再可淘汰
        need = _pages(req["prompt_len"] + ratio * req["max_tokens"], page_size) - locked
        if need > free_pages + (evictable_pages - locked) - committed:
            break  # 队头放不下：停下，不跳过它
        evictable_pages -= locked
        committed += need
        free_slots -= 1
        budget -= extend
        admitted.append(req["uid"])
    return admitted


def retract(running, *, page_size, available_pages):
    """返回这一步要撤回的 uid（先撤的在前）。"""
    if page_size < 1 or available_pages < 0:
        raise ValueError(f"page_size={page_size} available_pages={available_pages} is invalid")
    alive = list(running)
    victims = []

    def need():
        return sum(max(0, _pages(r["length"], page_size) - r["held_pages"]) for r in alive)

    while need() > available_pages and len(alive) > 1:
        victim = alive.pop()  # 最近接纳的
        available_pages += victim["held_pages"]  # 它的页进缓存（不锁）或还回空闲列表：都拿得到
        victims.append(victim["uid"])
    return victims
