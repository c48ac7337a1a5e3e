# Tangled from book/chapters/ch10_chunked_prefill.ipynb — edit the notebook, not this file.
"""第 10 章：长提示词到来时，正在 decode 的请求的 token 间隔——不分块 vs 分块（混合批）。"""

import random
import time
from typing import Dict, List

import torch

from minisgl.core import SamplingParams
from minisgl.llm import LLM
from minisgl.message import DetokenizeMsg, UserMsg


class Timed(LLM):
    """记下每个 token 出来的时间。"""

    def send_result(self, replies: List[DetokenizeMsg]) -> None:
        now = time.perf_counter()
        for r in replies:
            self.times.setdefault(r.uid, []).append(now)
        super().send_result(replies)


def run(budget: int) -> Dict[str, float]:
    llm = Timed(None, max_extend_tokens=budget, page_size=16, max_seq_len_override=2048, max_running_req=16)
    llm.times = {}
    rng = random.Random(0)
    decode_uids = list(range(8))
    for uid in decode_uids:  # 8 个一直 decode 的请求
        llm._outputs[uid] = []
        llm.receive_msg(UserMsg(uid, torch.randint(100, 20000, (32,), dtype=torch.int32),
                                SamplingParams(max_tokens=60, ignore_eos=True)))
    step, arrived = 0, 0
    with torch.inference_mode():
        while llm.run_step():
            step += 1
            if step % 12 == 0 and arrived < 3:  # 每 12 步来一个长提示词
                uid = 100 + arrived
                arrived += 1
                llm._outputs[uid] = []
                ids = [rng.randrange(100, 20000) for _ in range(960)]
                llm.receive_msg(UserMsg(uid, torch.tensor(ids, dtype=torch.int32),
                                        SamplingParams(max_tokens=4, ignore_eos=True)))
    gaps = sorted(b - a for u in decode_uids for a, b in zip(llm.times[u], llm.times[u][1:]))
    llm.cache.check_integrity()
    assert llm.table.num_free == 16, "every request slot must come back"
    llm.shutdown()
    return {"p50": gaps[len(gaps) // 2], "p95": gaps[int(len(gaps) * 0.95)], "max": gaps[-1]}


rows = [(budget, run(budget)) for budget in (8192, 256)]  # 两次都跑完再打印，表不被加载日志隔开
print(f"{'预算':>6} {'p50 间隔 (ms)':>14} {'p95 (ms)':>10} {'最大 (ms)':>10}")
for budget, g in rows:
    print(f"{budget:>6} {g['p50'] * 1000:>14.1f} {g['p95'] * 1000:>10.1f} {g['max'] * 1000:>10.1f}")
