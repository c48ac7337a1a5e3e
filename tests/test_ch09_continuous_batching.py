# Tangled from book/chapters/ch09_continuous_batching.ipynb — edit the notebook, not this file.
"""第 9 章：一起提交的请求与单独运行逐 token 相同；资源全部回来；接纳不超额；过长的请求被拒绝；中止不泄漏。"""
import pytest
import torch

from conftest import NUM_REQUESTS, check_batched, collecting_scheduler, mixed_workload
from minisgl.core import SamplingParams
from minisgl.llm import LLM
from minisgl.message import AbortBackendMsg, BatchBackendMsg, UserMsg
from minisgl.scheduler import SchedulerConfig


@pytest.mark.parametrize("fixture,cache_type,page_size", [
    ("tiny_qwen3", "radix", 1), ("tiny_qwen3", "radix", 16), ("tiny_qwen3", "naive", 1), ("tiny_qwen3", "naive", 16),
    ("smollm2", "radix", 16)])  # 第 11 章在两个模型上跑全部组合
def test_batched_equals_alone(fixture: str, cache_type: str, page_size: int, reference, request) -> None:
    path, n = request.getfixturevalue(fixture), NUM_REQUESTS[fixture]
    check_batched(path, *mixed_workload(n=n), reference(path, n), page_size=page_size, cache_type=cache_type)


def user(uid: int, n: int, max_tokens: int) -> UserMsg:
    return UserMsg(uid, torch.arange(100, 100 + n, dtype=torch.int32),
                   SamplingParams(max_tokens=max_tokens, ignore_eos=True))


def test_admission_never_overcommits(tiny_qwen3) -> None:
    """池子只有 40 页（页大小 4）：每个请求一生要 ⌈(20+60)/4⌉ = 20 页，同时最多两个。"""
    s = collecting_scheduler(SchedulerConfig(tiny_qwen3, device="cpu", page_size=4, num_pages=40, max_running_req=8,
                                max_seq_len_override=128))
    s.receive_msg(BatchBackendMsg([user(i, 20, 60) for i in range(5)]))
    with torch.inference_mode():
        while s.step():
            s.cache.check_integrity()
            assert len(s.running) <= 2 and s.cache.reserved <= 40
    assert s.finished() == {i: "length" for i in range(5)}
    assert s.table.num_free == 8
    s.shutdown()


def test_aborts_leak_nothing(tiny_qwen3) -> None:
    s = collecting_scheduler(SchedulerConfig(tiny_qwen3, device="cpu", page_size=4, num_pages=256, max_running_req=2,
                                max_seq_len_override=128))
    s.receive_msg(BatchBackendMsg([user(i, 10, 20) for i in range(4)]))
    with torch.inference_mode():
        s.step()  # 0、1 进来 prefill；2、3 在排队
        s.receive_msg(AbortBackendMsg(3))  # 排队中
        s.step()
        s.receive_msg(AbortBackendMsg(0))  # decode 中
        s.receive_msg(AbortBackendMsg(0))  # 重复的中止：什么也不做
        while s.step():
            s.cache.check_integrity()
        s.receive_msg(AbortBackendMsg(1))  # 已经结束：什么也不做
    assert s.finished() == {0: "abort", 1: "length", 2: "length", 3: "abort"}
    assert s.table.num_free == 2 and not s.running
    s.cache.flush()
    assert len(s.cache.free_pages) == 256
    s.shutdown()


def test_requests_that_cannot_fit_are_refused(tiny_qwen3) -> None:
    # 池子 32 页 × 4 = 128 个 token，正好一个 max_seq_len（引擎不允许更小的池子）
    llm = LLM(tiny_qwen3, device="cpu", page_size=4, num_pages=32, max_running_req=2, max_seq_len_override=128)
    with pytest.raises(ValueError, match="max_seq_len is 128"):
        llm.generate([list(range(200))])
    out = llm.generate([list(range(100, 200))], SamplingParams(max_tokens=100, ignore_eos=True), use_tqdm=False)
    assert out[0]["finish_reason"] == "length" and len(out[0]["token_ids"]) == 128 - 100  # 截到装得下的长度
    s = collecting_scheduler(SchedulerConfig(tiny_qwen3, device="cpu", page_size=4, num_pages=32, max_seq_len_override=128))
    s.receive_msg(user(7, 130, 4))  # 服务路径：立刻以 abort 结束，不会挂在队列里
    assert s.finished() == {7: "abort"} and not s.step()
    with pytest.raises(ValueError, match="--num-pages 8 holds 8 pages"):
        LLM(tiny_qwen3, device="cpu", page_size=4, num_pages=8, max_seq_len_override=128)
    llm.shutdown()
    s.shutdown()


def test_llm_api(tiny_qwen3) -> None:
    llm = LLM(tiny_qwen3, device="cpu", num_pages=512, max_running_req=4, max_seq_len_override=128)
    text = llm.generate("Hello", SamplingParams(max_tokens=5, ignore_eos=True), use_tqdm=False)
    ids = llm.generate([llm.tokenizer.encode("Hello")], SamplingParams(max_tokens=5, ignore_eos=True),
                       use_tqdm=False)
    assert text[0]["token_ids"] == ids[0]["token_ids"] and len(ids[0]["token_ids"]) == 5
    assert text[0]["text"] == llm.tokenizer.decode(ids[0]["token_ids"], skip_special_tokens=True)
    first = ids[0]["token_ids"][0]
    stopped = llm.generate([[1, 2, 3], llm.tokenizer.encode("Hello")],
                           [SamplingParams(max_tokens=3), SamplingParams(max_tokens=9, stop_token_ids=[first])],
                           use_tqdm=False)
    assert stopped[1] == {"text": stopped[1]["text"], "token_ids": [first], "finish_reason": "stop"}
    with pytest.raises(ValueError, match="2 prompts but 1 sampling_params"):
        llm.generate([[1], [2]], [SamplingParams()])
    llm.shutdown()
