# Tangled from book/chapters/ch10_chunked_prefill.ipynb — edit the notebook, not this file.
"""第 10 章：分块预填充与混合批——结果与单独运行相同；块不超过预算；decode 每步前进；中止分块中的请求不泄漏；
分块时撤回、等共享前缀都不出错。"""
from typing import List

import pytest
import torch

from conftest import NUM_REQUESTS, check_batched, check_retraction, generate_alone, mixed_workload
from minisgl.core import Batch, SamplingParams
from minisgl.message import AbortBackendMsg, DetokenizeMsg, UserMsg
from minisgl.scheduler import Scheduler, SchedulerConfig


@pytest.mark.parametrize("fixture,cache_type,page_size", [
    ("tiny_qwen3", "radix", 1), ("tiny_qwen3", "naive", 16), ("smollm2", "radix", 16)])
def test_chunked_equals_alone(fixture: str, cache_type: str, page_size: int, reference, request) -> None:
    path, n = request.getfixturevalue(fixture), NUM_REQUESTS[fixture]
    check_batched(path, *mixed_workload(n=n), reference(path, n), page_size=page_size, cache_type=cache_type,
                  max_extend_tokens=16)


class Recorder(Scheduler):
    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.replies: List[DetokenizeMsg] = []
        self.batches: List[tuple] = []

    def send_result(self, replies: List[DetokenizeMsg]) -> None:
        self.replies.extend(replies)

    def launch(self, batch: Batch):
        self.batches.append((batch.phase, [(r.uid, r.extend_len) for r in batch.reqs]))
        return super().launch(batch)


def test_chunks_respect_the_budget_and_decodes_progress(tiny_qwen3) -> None:
    s = Recorder(SchedulerConfig(tiny_qwen3, device="cpu", page_size=4, num_pages=256, max_running_req=8,
                                 max_seq_len_override=256, max_extend_tokens=32))
    sp = SamplingParams(max_tokens=30, ignore_eos=True)
    for uid in range(3):
        s.receive_msg(UserMsg(uid, torch.arange(10, 20, dtype=torch.int32), sp))
    with torch.inference_mode():
        for _ in range(3):
            s.step()
        s.receive_msg(UserMsg(9, torch.arange(100, 200, dtype=torch.int32), SamplingParams(max_tokens=2)))
        while s.step():
            s.cache.check_integrity()
    chunks = [dict(reqs)[9] for _, reqs in s.batches if 9 in dict(reqs)]
    assert chunks[:4] == [29, 29, 29, 13], chunks  # 100 个 token：每步 32 − 3 个 decode，最后一块 13
    for phase, reqs in s.batches:
        assert sum(n for _, n in reqs) <= 32
        if any(uid == 9 for uid, _ in reqs):  # 长提示词在算的每一步，3 个 decode 请求都在批里
            assert {0, 1, 2} <= {uid for uid, _ in reqs}, reqs
    assert [r.next_token for r in s.replies if r.uid == 9][0] >= 0 and s.table.num_free == 8
    s.shutdown()


def test_abort_mid_chunk_leaks_nothing(tiny_qwen3) -> None:
    s = Recorder(SchedulerConfig(tiny_qwen3, device="cpu", page_size=4, num_pages=256, max_running_req=4,
                                 max_seq_len_override=256, max_extend_tokens=16))
    s.receive_msg(UserMsg(1, torch.arange(100, 160, dtype=torch.int32), SamplingParams(max_tokens=4)))
    with torch.inference_mode():
        s.step()
        s.step()  # 算了两块，还剩两块
        s.receive_msg(AbortBackendMsg(1))
        assert not s.step()  # 不会再接着算它
    assert [(r.uid, r.finish_reason) for r in s.replies] == [(1, "abort")]
    s.cache.check_integrity()
    assert s.table.num_free == 4 and s.prefill.chunked is None
    s.shutdown()


def test_prefix_hit_inside_a_chunk(tiny_qwen3) -> None:
    """第一个请求让 40 个 token 进入缓存；第二个请求共享其中 37 个：命中后从第 37 个 token 接着切块。"""
    from minisgl.llm import LLM

    base = list(range(300, 340))
    other = base[:37] + list(range(900, 930))
    alone = generate_alone(tiny_qwen3, [other], [SamplingParams(max_tokens=6, ignore_eos=True)])
    llm = LLM(tiny_qwen3, device="cpu", max_extend_tokens=16, num_pages=512, max_seq_len_override=128)
    llm.generate([base], SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)
    got = llm.generate([other], SamplingParams(max_tokens=6, ignore_eos=True), use_tqdm=False)
    assert llm.cache.hit_tokens == 37 and got[0]["token_ids"] == alone[0]
    llm.shutdown()

def test_retraction_with_chunks(tiny_qwen3) -> None:
    """预算 8 或 16 个 token：几乎每个提示词都要切块，分块中的请求也会被撤回。"""
    check_retraction(tiny_qwen3, 4, max_examples=5, budgets=(8, 16))


def test_shared_prefix_hit_after_the_chunks(tiny_qwen3) -> None:
    """A 的提示词切成 10 块；共享它前 64 个 token 的 B 一起到达：A 分块时预算全给了 A，B 等到 A 算完插进缓存，
    再命中这 64 个 token。"""
    system = list(range(3000, 3160))  # 160 个 token：预算 16 时 A 要算 10 步
    s = Recorder(SchedulerConfig(tiny_qwen3, device="cpu", page_size=1, num_pages=512, max_running_req=4,
                                 max_seq_len_override=256, max_extend_tokens=16))
    sp = SamplingParams(max_tokens=2, ignore_eos=True)
    s.receive_msg(UserMsg(0, torch.tensor(system, dtype=torch.int32), sp))
    s.receive_msg(UserMsg(1, torch.tensor(system[:64] + [5, 6], dtype=torch.int32), sp))
    with torch.inference_mode():
        while s.step():
            s.cache.check_integrity()
    first_b = next(i for i, (_, reqs) in enumerate(s.batches) if 1 in dict(reqs))
    assert first_b == 10 and dict(s.batches[first_b][1])[1] == 2  # 66 个 token 只算了最后 2 个
    assert [r.cached_tokens for r in s.replies if r.uid == 1][0] == 64
    s.shutdown()
