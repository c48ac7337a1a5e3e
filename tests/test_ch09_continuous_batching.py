# Tangled from book/chapters/ch09_continuous_batching.ipynb — edit the notebook, not this file.
"""第 9 章：一起提交的请求与单独运行逐 token 相同；资源全部回来；按估计接纳、页不够时撤回，结果不变；
前缀在 prefill 算完时就能命中；过长的请求被拒绝；中止和 Ctrl-C 不泄漏。"""
import signal

import pytest
import torch

from conftest import (NUM_REQUESTS, check_batched, check_failed_step_recovers, check_retraction, collecting_scheduler,
                      mixed_workload)
from minisgl.core import SamplingParams
from minisgl.llm import LLM
from minisgl.message import AbortBackendMsg, BatchBackendMsg, UserMsg
from minisgl.scheduler import SchedulerConfig
from minisgl.scheduler.prefill import MAX_WAIT_STEPS


@pytest.mark.parametrize("fixture,cache_type,page_size", [
    ("tiny_qwen3", "radix", 1), ("tiny_qwen3", "radix", 16), ("tiny_qwen3", "naive", 1), ("tiny_qwen3", "naive", 16),
    ("smollm2", "radix", 16)])  # 第 11 章在小 Qwen3 上跑全部组合，SmolLM2 上跑两两覆盖的 5 种
def test_batched_equals_alone(fixture: str, cache_type: str, page_size: int, reference, request) -> None:
    path, n = request.getfixturevalue(fixture), NUM_REQUESTS[fixture]
    check_batched(path, *mixed_workload(n=n), reference(path, n), page_size=page_size, cache_type=cache_type)


def user(uid: int, n: int, max_tokens: int, first: int = 100) -> UserMsg:
    return UserMsg(uid, torch.arange(first, first + n, dtype=torch.int32),
                   SamplingParams(max_tokens=max_tokens, ignore_eos=True))


def run_admission(path, admission: str):
    """池子 40 页（页大小 4）；6 个请求各要 16 + 60 个 token。返回（每个请求的 token、同时运行的最大请求数、撤回次数）。"""
    s = collecting_scheduler(SchedulerConfig(path, device="cpu", page_size=4, num_pages=40, max_running_req=8,
                                             max_seq_len_override=128, admission=admission))
    s.receive_msg(BatchBackendMsg([user(i, 16, 60, first=100 + 50 * i) for i in range(6)]))
    most = 0
    with torch.inference_mode():
        while s.step():
            s.cache.check_integrity()
            most = max(most, len(s.running))
    assert s.finished() == {i: "length" for i in range(6)} and s.table.num_free == 8
    tokens = {i: [r.next_token for r in s.replies if r.uid == i] for i in range(6)}
    s.shutdown()
    return tokens, most, s.num_retracted


def test_reserve_never_overcommits_and_optimistic_retracts(tiny_qwen3) -> None:
    """reserve：每个请求一生要 ⌈(16+60)/4⌉ = 19 页，同时最多两个，从不撤回。optimistic：第一批跑了一阵、估计的
    比例降下来以后接纳得更多，池子不够时撤回，生成的 token 一个不差。"""
    reserved, most_reserved, retracted = run_admission(tiny_qwen3, "reserve")
    assert most_reserved == 2 and retracted == 0
    optimistic, most, retracted = run_admission(tiny_qwen3, "optimistic")
    assert most > 2 and retracted > 0
    assert optimistic == reserved


def test_hit_tokens_count_first_admissions_only(tiny_qwen3) -> None:
    """两个提示词互不相同的请求，池子（24 页）放不下两个都写完：后接纳的那个被撤回，它的提示词和输出进了缓存，
    再接纳时命中自己的 16 个 token。hit_tokens 只数第一次接纳时命中的（0），和请求自己报的 cached_tokens 一致。"""
    s = collecting_scheduler(SchedulerConfig(tiny_qwen3, device="cpu", page_size=4, num_pages=24, max_running_req=8,
                                             max_seq_len_override=64))
    s.receive_msg(BatchBackendMsg([user(i, 16, 40, first=100 + 50 * i) for i in range(2)]))
    readmitted = []
    admit = s.cache.admit
    def spy(uid, input_ids, match, *args, **kw):
        matched = admit(uid, input_ids, match, *args, **kw)
        if matched is not None and not kw.get("first", True):
            readmitted.append(matched)
        return matched
    s.cache.admit = spy
    with torch.inference_mode():
        while s.step():
            s.cache.check_integrity()
    assert s.num_retracted == 1 and readmitted and readmitted[0] > 0, (s.num_retracted, readmitted)
    assert s.cache.hit_tokens == sum(r.cached_tokens for r in s.replies) == 0
    s.shutdown()


@pytest.mark.parametrize("page_size", [1, 4])
def test_retraction_property(tiny_qwen3, page_size: int) -> None:
    check_retraction(tiny_qwen3, page_size, max_examples=5)


def test_prefix_is_shared_while_the_first_request_decodes(tiny_qwen3) -> None:
    """A 还在 decode 时到达的 B 就命中 A 的提示词：prefill 一算完，提示词的整页就插进了缓存。"""
    system = list(range(1000, 1040))  # 40 个 token = 10 页
    s = collecting_scheduler(SchedulerConfig(tiny_qwen3, device="cpu", page_size=4, num_pages=256, max_running_req=4,
                                             max_seq_len_override=128))
    sp = SamplingParams(max_tokens=20, ignore_eos=True)
    s.receive_msg(UserMsg(0, torch.tensor(system + [7, 8, 9], dtype=torch.int32), sp))
    with torch.inference_mode():
        s.step()
        s.step()  # A 在 decode
        assert 0 in s.decode.running
        s.receive_msg(UserMsg(1, torch.tensor(system + [5, 6], dtype=torch.int32), sp))
        while s.step():
            s.cache.check_integrity()
    first = {r.uid: r.cached_tokens for r in s.replies if r.cached_tokens}
    assert first == {1: 40}, first
    s.shutdown()


def shared_prefix_scheduler(tiny_qwen3):
    """等共享前缀的两个测试用的：页大小 1 的调度器、64 个 token 的共同前缀、4 个 token 的贪心采样参数。"""
    s = collecting_scheduler(SchedulerConfig(tiny_qwen3, device="cpu", page_size=1, num_pages=512, max_running_req=4,
                                             max_seq_len_override=128))
    return s, list(range(2000, 2064)), SamplingParams(max_tokens=4, ignore_eos=True)


def test_requests_sharing_a_prefix_wait_for_one_to_compute_it(tiny_qwen3) -> None:
    """三个共享 64 个 token 前缀的请求一起到达：只有一个去算这个前缀，另外两个等一步，然后命中缓存。"""
    s, system, sp = shared_prefix_scheduler(tiny_qwen3)
    s.receive_msg(BatchBackendMsg([UserMsg(i, torch.tensor(system + [10 + i], dtype=torch.int32), sp)
                                   for i in range(3)]))
    with torch.inference_mode():
        batch = s.schedule_next_batch()
        assert [r.uid for r in batch.reqs] == [0]  # 1、2 等着
        s.process(batch, s.launch(batch))
        while s.step():
            pass
    assert {r.uid: r.cached_tokens for r in s.replies if r.cached_tokens} == {1: 64, 2: 64}
    assert s.cache.hit_tokens == 128
    s.shutdown()


def test_waiting_for_a_shared_prefix_is_bounded(tiny_qwen3) -> None:
    """A 接纳了、还没算（这一步的 prefill 没提交）：共享它前缀的 B 每一步都让，但最多让 MAX_WAIT_STEPS 步。"""
    s, system, sp = shared_prefix_scheduler(tiny_qwen3)
    s.receive_msg(UserMsg(0, torch.tensor(system + [1], dtype=torch.int32), sp))
    assert [r.uid for r in s.schedule_next_batch().reqs] == [0]
    s.receive_msg(UserMsg(1, torch.tensor(system + [2], dtype=torch.int32), sp))
    for _ in range(MAX_WAIT_STEPS):
        assert s.schedule_next_batch() is None  # B 在等 A 的前缀进缓存
    assert [r.uid for r in s.schedule_next_batch().reqs] == [1]  # 等够了：自己算
    s.abort_request(0)
    s.abort_request(1)
    s.cache.check_integrity()
    assert s.table.num_free == 4 and not s.running
    s.shutdown()


def test_page_counts(tiny_qwen3) -> None:
    """/metrics 的三个数：cached 只数没有运行中的请求在用的缓存页；运行中的请求锁住的缓存页算 used。"""
    s = collecting_scheduler(SchedulerConfig(tiny_qwen3, device="cpu", page_size=4, num_pages=64, max_running_req=4,
                                             max_seq_len_override=128))
    with torch.inference_mode():
        s.receive_msg(user(0, 40, 4))
        while s.step():
            pass
        counts = s.cache.page_counts()
        assert counts == (0, 10, 54), counts  # 40 + 4 个 token，有 K/V 的 43 个：10 整页留在缓存里
        s.receive_msg(user(1, 41, 4))  # 同样的 40 个 token 开头：命中 10 页并锁住
        s.step()
        used, cached, free = s.cache.page_counts()
        assert cached == 0 and used == 10 + 1 and free == 53 and used + cached + free == 64
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
    out = llm.generate([list(range(100, 120))], SamplingParams(ignore_eos=True), use_tqdm=False)
    assert len(out[0]["token_ids"]) == 128 - 20  # 没给 max_tokens：一直生成到上下文用完
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
    again = [llm.generate([list(range(300, 320))], SamplingParams(max_tokens=2), use_tqdm=False)[0] for _ in range(2)]
    assert [o["cached_tokens"] for o in again] == [0, 19]  # 第二次：提示词除了最后一个 token 都在缓存里
    first = ids[0]["token_ids"][0]
    stopped = llm.generate([[1, 2, 3], llm.tokenizer.encode("Hello")],
                           [SamplingParams(max_tokens=3), SamplingParams(max_tokens=9, stop_token_ids=[first])],
                           use_tqdm=False)
    assert stopped[1] == {"text": stopped[1]["text"], "token_ids": [first], "finish_reason": "stop",
                          "cached_tokens": stopped[1]["cached_tokens"]}
    with pytest.raises(ValueError, match="2 prompts but 1 sampling_params"):
        llm.generate([[1], [2]], [SamplingParams()])
    V = llm.engine.model_config.vocab_size
    for bad in ([[1, 2], [V]], [[1, 2], [-1]], [[1, 2], []]):  # 第一个合格：也不能留在调度器里
        with pytest.raises(ValueError, match="outside the vocabulary|is empty"):
            llm.generate(bad)
        assert not llm.prefill.pending and not llm.running
    for wrong in (5, torch.tensor([1, 2]), [[1.5, 2.0]], [[1, 2], [True]], (p for p in ["a"])):  # 类型不对：TypeError
        with pytest.raises(TypeError, match="prompt"):
            llm.generate(wrong)
    with pytest.raises(TypeError, match="sampling_params must be SamplingParams"):
        llm.generate([[1, 2]], {"max_tokens": 2})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="stop_token_ids has token ids outside"):
        llm.generate([[1, 2]], SamplingParams(stop_token_ids=[V]))
    assert not llm.prefill.pending and not llm.running
    with llm as same:  # 上下文管理器：离开时 shutdown
        assert same is llm and llm.generate([[1, 2]], SamplingParams(max_tokens=2), use_tqdm=False)


def test_ctrl_c_lands_between_steps(tiny_qwen3) -> None:
    """generate 里第 3 步时来了 SIGINT：这一步照常算完，没结束的请求被中止、页和槽全部回来，然后才抛出
    KeyboardInterrupt；之后的 generate 和从没被打断过的 LLM 逐 token 相同（还命中了被打断时算好的前缀）。"""
    def make() -> LLM:
        return LLM(tiny_qwen3, device="cpu", page_size=4, num_pages=256, max_running_req=4, max_seq_len_override=128)

    prompts = [list(range(10 + i, 30 + i)) for i in range(6)]
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    llm, steps = make(), []

    def run_step() -> bool:
        steps.append(len(steps))
        if len(steps) == 3:
            signal.raise_signal(signal.SIGINT)  # 处理函数在下一条字节码处运行：正在这一步里面
        return LLM.run_step(llm)

    llm.run_step = run_step  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        llm.generate(prompts, params, use_tqdm=False)
    assert 3 <= len(steps) < 10  # 第 3 步之后停下（加上收尾的几步），而不是跑完 40 个 token
    del llm.run_step
    assert not llm.prefill.pending and not llm.running and llm.table.num_free == 4
    assert not llm._outputs and not llm._done
    llm.cache.check_integrity()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # 处理函数换回去了
    got = llm.generate(prompts[:2], params, use_tqdm=False)
    llm.cache.flush()
    assert len(llm.cache.free_pages) == 256
    llm.shutdown()
    fresh = make()
    assert [o["token_ids"] for o in got] == [o["token_ids"] for o in fresh.generate(prompts[:2], params, use_tqdm=False)]
    assert [o["cached_tokens"] for o in got] == [16, 16]  # 被打断的那次 prefill 算好的整页还在前缀缓存里
    fresh.shutdown()


def test_a_failed_step_gives_everything_back(tiny_qwen3) -> None:
    """第 3 次前向抛了异常（模拟显存不够）：异常原样抛出，资源全部回来，这个 LLM 还能接着用（conftest 的检查）。"""
    check_failed_step_recovers(tiny_qwen3)


def test_two_llms_in_one_process(tiny_qwen3) -> None:
    """一个进程里先后建两个 LLM、交替生成：每个前向装上自己引擎的 Context，结果与各自单独运行相同；关掉一个，
    另一个照常。logit_bias 里词表外的编号在提交前就报 ValueError。"""
    prompts, params = [[5, 6, 7, 8], [9, 10, 11]], SamplingParams(max_tokens=6, ignore_eos=True)
    a = LLM(tiny_qwen3, device="cpu", num_pages=128, max_seq_len_override=64)
    b = LLM(tiny_qwen3, device="cpu", page_size=4, num_pages=64, max_seq_len_override=64)
    want = [o["token_ids"] for o in a.generate(prompts, params, use_tqdm=False)]
    for llm in (b, a, b):
        assert [o["token_ids"] for o in llm.generate(prompts, params, use_tqdm=False)] == want
    b.shutdown()
    assert [o["token_ids"] for o in a.generate(prompts, params, use_tqdm=False)] == want
    V = a.engine.model_config.vocab_size
    with pytest.raises(ValueError, match="logit_bias"):
        a.generate(prompts, SamplingParams(max_tokens=4, logit_bias={str(V + 5): 5.0}), use_tqdm=False)
    assert not a.has_work and not a._outputs
    a.shutdown()
