"""第 11 章练习：重叠调度的循环（参考答案）。"""


def simulate(requests, aborts):
    """返回 (outputs, released)。"""
    outputs = {uid: [] for uid in requests}
    launched = {uid: 0 for uid in requests}
    running = set(requests)  # 调度器认为还在运行的
    deferred = set()
    released = []
    last = None  # (步号, 这一步里的 uid)
    step = 0
    rnd = 0
    while True:
        batch = [u for u in requests if u in running and launched[u] < requests[u]]
        current = None
        if batch:
            for u in batch:
                launched[u] += 1
            current = (step, set(batch))
            step += 1
        in_flight = current[1] if current else set()
        for uid in aborts.get(rnd, []):
            if uid in running:
                running.discard(uid)
                if uid in in_flight:
                    deferred.add(uid)
                else:
                    released.append((uid, rnd))
        if last is not None:
            k, members = last
            for uid in sorted(members, key=list(requests).index):
                if uid in deferred:  # token 丢掉；它所在的最后一步处理完了才释放
                    if uid not in in_flight:
                        deferred.discard(uid)
                        released.append((uid, rnd))
                    continue
                if uid not in running:
                    continue
                outputs[uid].append(k)
                if len(outputs[uid]) == requests[uid]:
                    running.discard(uid)
                    if uid in in_flight:
                        deferred.add(uid)
                    else:
                        released.append((uid, rnd))
        if current is None and last is None:
            break
        last = current
        rnd += 1
    return outputs, released
