"""第 10 章练习：分块预填充（参考答案）。"""


def plan_chunks(requests, budget, decodes):
    """每一步 {uid: 这一步算的 token 数}，直到所有提示词算完。"""
    if budget < 1:
        raise ValueError(f"budget={budget} must be >= 1")
    if decodes < 0:
        raise ValueError(f"decodes={decodes} must be >= 0")
    queue = []
    for uid, prompt_len, cached in requests:
        if not 0 <= cached < prompt_len:
            raise ValueError(f"cached={cached} must be in [0, {prompt_len}) for request {uid!r}")
        queue.append([uid, prompt_len - cached])
    steps, chunked = [], None
    while queue or chunked:
        left = max(budget - decodes, 1)
        step = {}
        order = ([chunked] if chunked else [])
        chunked = None
        while left > 0 and (order or queue):
            req = order.pop(0) if order else queue.pop(0)
            n = min(req[1], left)
            step[req[0]] = n
            req[1] -= n
            left -= n
            if req[1]:
                chunked = req
        steps.append(step)
    return steps
