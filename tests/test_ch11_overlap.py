# Tangled from book/chapters/ch11_overlap.ipynb — edit the notebook, not this file.
"""第 11 章：所有调度组合下结果与单独运行相同；五种状态下的中止不泄漏、不重复释放；重叠时反复撤回也不丢 token。"""
import itertools

import pytest
import torch

from conftest import (NUM_REQUESTS, RetractionRig, check_batched, check_retraction, collecting_scheduler,
                      generate_alone, mixed_workload)
from minisgl.core import SamplingParams
from minisgl.message import UserMsg
from minisgl.scheduler import SchedulerConfig

WORKLOAD = mixed_workload()
LEVELS = [["radix", "naive"], [1, 16], [16, 8192], [False, True]]  # cache_type, page_size, budget, overlap
COMBOS = list(itertools.product(*LEVELS))
# SmolLM2 只跑两两覆盖的 5 种：任意两个维度的任意两个取值都同时出现过
PAIRWISE = [("radix", 1, 16, False), ("radix", 16, 8192, True), ("naive", 1, 8192, True), ("naive", 16, 16, True),
            ("naive", 16, 8192, False)]


@pytest.mark.parametrize("fixture,cache_type,page_size,budget,overlap",
                         [("tiny_qwen3", *c) for c in COMBOS] + [("smollm2", *c) for c in PAIRWISE])
def test_every_combination_equals_alone(fixture, cache_type, page_size, budget, overlap, reference, request) -> None:
    path, n = request.getfixturevalue(fixture), NUM_REQUESTS[fixture]
    check_batched(path, *mixed_workload(n=n), reference(path, n), page_size=page_size, cache_type=cache_type,
                  max_extend_tokens=budget, enable_overlap=overlap)


def test_pairwise_subset_covers_every_pair() -> None:
    for i, j in itertools.combinations(range(len(LEVELS)), 2):
        for a, b in itertools.product(LEVELS[i], LEVELS[j]):
            assert any(c[i] == a and c[j] == b for c in PAIRWISE), (i, j, a, b)


@pytest.mark.gpu
def test_gpu_overlap_on_and_off_equal_alone(tiny_qwen3_hd128) -> None:
    gpu = dict(device="cuda", dtype="float32", attention_backend="torch")
    ref = generate_alone(tiny_qwen3_hd128, *WORKLOAD, **gpu)
    for overlap in (False, True):
        check_batched(tiny_qwen3_hd128, *WORKLOAD, ref, page_size=16, max_extend_tokens=16, enable_overlap=overlap,
                      **gpu)


@pytest.mark.parametrize("overlap", [True, False])
def test_abort_in_every_state(tiny_qwen3, overlap: bool) -> None:
    s = collecting_scheduler(SchedulerConfig(tiny_qwen3, device="cpu", page_size=4, num_pages=512, max_running_req=8,
                                max_seq_len_override=256, max_extend_tokens=16, enable_overlap=overlap))

    def user(uid: int, n: int, m: int) -> None:
        s.receive_msg(UserMsg(uid, torch.arange(100, 100 + n, dtype=torch.int32),
                              SamplingParams(max_tokens=m, ignore_eos=True)))

    user(0, 60, 20)  # 长提示词：要分块
    for uid in range(1, 8):
        user(uid, 5, 20)
    user(8, 5, 3)
    user(9, 5, 20)  # 请求槽只有 8 个：9 在排队
    seen = set()
    with torch.inference_mode():
        s.run_step()
        assert s.prefill.chunked is not None and s.prefill.chunked.uid == 0
        assert (0 in s._in_flight) == overlap
        s.abort_request(0)  # 分块预填充中（重叠时也在飞行中的那一步里）
        seen.add("chunked")
        assert any(p.uid == 9 for p in s.prefill.pending)
        s.abort_request(9)  # 排队中
        seen.add("waiting")
        while 1 not in s.decode.running:
            s.run_step()
        s.abort_request(1)  # decode 中
        seen.add("decoding")
        for _ in range(500):  # 8 的最后一个 token 已经提交、结果还没处理：已经结束但还没报告
            s.run_step()
            r8 = s.running.get(8)
            if overlap and r8 is not None and r8.remain_len <= 0 and 8 in s._in_flight:
                break
            if not overlap and any(r.uid == 8 and r.finished for r in s.replies):
                break
        if overlap:
            assert r8 is not None and 8 in s._in_flight
            s.abort_request(8)
            seen.add("finished, not reported")
        s.abort_request(2)  # 运行中；重叠时它在飞行中的那一步里
        s.abort_request(2)  # 重复的中止
        seen.add("in flight" if overlap else "running")
        while s.run_step():
            s.cache.check_integrity()
        s.abort_request(3)  # 已经结束：什么也不做
    done = {}
    for r in s.replies:
        if r.finished:
            assert r.uid not in done, f"request {r.uid} finished twice"
            done[r.uid] = r.finish_reason
    assert sorted(done) == list(range(10))
    assert {u for u, why in done.items() if why == "abort"} == ({0, 1, 2, 8, 9} if overlap else {0, 1, 2, 9})
    assert len(seen) == (5 if overlap else 4) and not s._deferred and not s.running
    s.cache.check_integrity()
    assert s.table.num_free == 8
    s.cache.flush()
    assert len(s.cache.free_pages) == 512
    s.shutdown()


@pytest.mark.parametrize("page_size", [1, 4])
def test_retraction_with_overlap(tiny_qwen3, page_size: int) -> None:
    """反复撤回的性质测试（第 9 章的 RetractionRig），重叠开和关、分块和不分块都混在里面：被撤回的请求可能正在
    飞行中的那一步里，可能在分块，可能被中止、碰到停止 token 或"停止词"。"""
    check_retraction(tiny_qwen3, page_size, max_examples=6, overlaps=(False, True), budgets=(8, 8192))


def test_abort_a_retracted_request(tiny_qwen3) -> None:
    """重叠开：撤回的请求回到队首；在那里中止它，它恰好收到一个 "abort"，之前发出的 token 不重发、不丢；
    其余请求与单独运行相同。"""
    rig = RetractionRig(tiny_qwen3, page_size=4)
    s = rig.s
    prompts = [list(range(200 + 30 * i, 212 + 30 * i)) for i in range(4)]
    refs = [rig.alone(p, 30) for p in prompts]
    for uid, p in enumerate(prompts):
        s.receive_msg(UserMsg(uid, torch.tensor(p, dtype=torch.int32), SamplingParams(max_tokens=30, ignore_eos=True)))
    with torch.inference_mode():
        while not s.num_retracted:
            s.overlap_step()
            s.cache.check_integrity()
        victim = s.prefill.pending[0]
        assert victim.num_outputs > 0  # 撤回时它已经生成过 token
        s.abort_request(victim.uid)
        while s.overlap_step():
            s.cache.check_integrity()
    got = {uid: [r.next_token for r in s.replies if r.uid == uid and r.next_token >= 0] for uid in range(4)}
    assert s.finished() == {uid: "abort" if uid == victim.uid else "length" for uid in range(4)}
    assert got[victim.uid] == refs[victim.uid][:victim.num_outputs]
    assert all(got[u] == refs[u] for u in range(4) if u != victim.uid)
    assert not s.running and not s._deferred and s.table.num_free == s.table.max_running_req
    rig.close()
