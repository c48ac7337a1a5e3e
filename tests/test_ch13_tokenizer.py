# Tangled from book/chapters/ch13_tokenizer.ipynb — edit the notebook, not this file.
"""第 13 章：对话模板；增量反分词与一次性解码相同（性质测试）；stop 字符串；中止的路由；ZMQ 上的分词进程。"""
from __future__ import annotations

import contextlib
import multiprocessing as mp
import random
import tempfile
import threading
from typing import Any, Dict, List

import pytest
import torch

from minisgl.core import SamplingParams
from minisgl.message import (AbortBackendMsg, AbortMsg, BatchBackendMsg, BatchFrontendMsg, BatchTokenizerMsg,
                             DetokenizeInfoMsg, DetokenizeMsg, TokenizeMsg, UserMsg, UserReply, encode)
from minisgl.llm import LLM
from minisgl.tokenizer import (DetokenizeManager, TokenizeManager, TokenizerLoop, nth_sample, token_bytes,
                               tokenize_worker)
from minisgl.utils.hf import default_model_path, load_tokenizer, qwen3_tokenizer_dir
from minisgl.utils.mp import ZmqPullQueue, ZmqPushQueue

TEXTS = ["北京烤鸭🦆很好吃。", "Hello, world! 👋🏽 👨‍👩‍👧", "日本語のテキストと한국어 텍스트", "emoji 🚀🌏🎉 and math ∑∫√π",
         "  spaces\n\n\ttabs  ", "Ünïcödé çafé naïve", "<think>\n想一想\n</think>\n\n答案是 42。"]


@pytest.fixture(scope="module")
def tokenizers() -> Dict[str, Any]:
    return {"qwen3": load_tokenizer(qwen3_tokenizer_dir()), "smollm2": load_tokenizer(default_model_path())}


def feed(d: DetokenizeManager, ids: List[int], uid: int = 0, finish_reason: str = "length") -> List[UserReply]:
    """把 ids 依次送进去，最后一个带 finished；返回收到的回复（请求结束就停）。"""
    replies = []
    for i, t in enumerate(ids):
        last = i == len(ids) - 1
        r = d.detokenize(DetokenizeMsg(uid, t, finished=last, finish_reason=finish_reason if last else None))
        if r is not None:
            replies.append(r)
            if r.finished:
                break
    return replies


def text_of(replies: List[UserReply]) -> str:
    return "".join(r.incremental_output for r in replies)


def random_ids(tok: Any, rng: random.Random) -> List[int]:
    kind = rng.randrange(4)
    if kind == 0:  # 词表里均匀随机：常常拼出不合法的 UTF-8
        return [rng.randrange(len(tok)) for _ in range(rng.randint(1, 40))]
    ids = tok.encode("".join(rng.choice(TEXTS) for _ in range(rng.randint(1, 3))), add_special_tokens=False)
    if kind == 1:  # 在任意位置截断：可能截在一个字符的字节中间
        ids = ids[: rng.randint(1, len(ids))]
    elif kind == 2:  # 插进特殊 token 和随机 token
        for _ in range(rng.randint(1, 4)):
            ids.insert(rng.randint(0, len(ids)), rng.choice(tok.all_special_ids + [rng.randrange(len(tok))]))
    return ids


@pytest.mark.parametrize("name", ["qwen3", "smollm2"])
def test_incremental_equals_one_shot(tokenizers: Dict[str, Any], name: str) -> None:
    tok = tokenizers[name]
    for seed in range(300):
        ids = random_ids(tok, random.Random(seed))
        d = DetokenizeManager(tok)
        replies = feed(d, ids)
        one_shot = tok.decode(ids, skip_special_tokens=True)
        assert text_of(replies) == one_shot, f"seed {seed}: ids {ids}"
        if "\ufffd" not in one_shot:
            assert not any("\ufffd" in r.incremental_output for r in replies), f"seed {seed}: a broken character"
        assert len(replies) == len(ids) and replies[-1].finished and not d.states  # 每个 token 一条回复，结束后清空


def test_plain_text_streams_without_delay(tokenizers: Dict[str, Any]) -> None:
    tok = tokenizers["smollm2"]
    ids = tok.encode("The quick brown fox jumps over the lazy dog.")
    assert [r.incremental_output for r in feed(DetokenizeManager(tok), ids)] == [tok.decode([t]) for t in ids]
    ids = tok.encode("鸭")  # 一个汉字被切成几个 token：等最后一个字节到了才发
    assert len(ids) > 1 and [r.incremental_output for r in feed(DetokenizeManager(tok), ids)] == [""] * (len(ids) - 1) + ["鸭"]


def test_chat_templates(tokenizers: Dict[str, Any]) -> None:
    qwen, smol = TokenizeManager(tokenizers["qwen3"]), TokenizeManager(tokenizers["smollm2"])
    chat = [{"role": "user", "content": "你好"}]
    thinking = qwen.render(chat, {"enable_thinking": True})
    assert thinking == qwen.render(chat) == "<|im_start|>user\n你好<|im_end|>\n<|im_start|>assistant\n"
    assert qwen.render(chat, {"enable_thinking": False}) == thinking + "<think>\n\n</think>\n\n"
    msg = qwen.tokenize(TokenizeMsg(uid=3, text=chat, sampling_params=SamplingParams(max_tokens=5),
                                    chat_options={"enable_thinking": False}))
    assert msg.uid == 3 and msg.sampling_params.max_tokens == 5 and msg.input_ids.dtype == torch.int32
    assert msg.input_ids.tolist() == tokenizers["qwen3"].encode(thinking + "<think>\n\n</think>\n\n")
    assert tokenizers["qwen3"].convert_tokens_to_ids("<think>") in msg.input_ids.tolist()  # 一个 token，不是字符
    two = [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}]
    assert smol.render(two, {"enable_thinking": False}) == \
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert smol.render(chat).startswith("<|im_start|>system\n")  # 没有 system 消息时模板给一条默认的
    assert qwen.tokenize(TokenizeMsg(0, "1+1=", SamplingParams())).input_ids.tolist() == \
        tokenizers["qwen3"].encode("1+1=")  # 纯提示词：不套模板
    with pytest.raises(ValueError, match="^the prompt is empty after tokenization$"):
        qwen.tokenize(TokenizeMsg(9, "", SamplingParams()))
    assert qwen.tokenize(TokenizeMsg(4, [5, 0, 151643], SamplingParams())).input_ids.tolist() == [5, 0, 151643]


def test_requests_that_do_not_fit_are_refused_with_the_numbers(tokenizers: Dict[str, Any]) -> None:
    m = TokenizeManager(tokenizers["qwen3"], max_seq_len=10)
    assert len(m.tokenize(TokenizeMsg(0, [1] * 6, SamplingParams(max_tokens=4))).input_ids) == 6  # 正好放满
    with pytest.raises(ValueError, match=r"^max_tokens=5 is too large: the prompt has 6 tokens and the context is 10, "
                                         r"so at most 4 tokens can be generated$"):
        m.tokenize(TokenizeMsg(0, [1] * 6, SamplingParams(max_tokens=5)))
    with pytest.raises(ValueError, match="the prompt has 10 tokens; this server's context is 10 tokens"):
        m.tokenize(TokenizeMsg(0, [1] * 10, SamplingParams()))
    loop = TokenizerLoop(tokenizers["qwen3"], max_seq_len=10)  # 进程里：拒绝变成一条带原因的回复，调度器什么也收不到
    out = loop.step([TokenizeMsg(3, [1] * 6, SamplingParams(max_tokens=5))])
    assert not out.backend and len(out.frontend) == 1 and out.frontend[0].finish_reason == "abort"
    assert out.frontend[0].finished and out.frontend[0].error.startswith("max_tokens=5 is too large")


def test_think_tokens_are_kept_and_special_tokens_skipped(tokenizers: Dict[str, Any]) -> None:
    tok = tokenizers["qwen3"]
    ids = tok.encode("<think>\n嗯\n</think>\n\n好<|im_end|>")
    assert len(ids) < 10 and tok.convert_tokens_to_ids("<think>") in ids
    assert text_of(feed(DetokenizeManager(tok), ids)) == "<think>\n嗯\n</think>\n\n好"


def test_stop_string_across_token_boundaries(tokenizers: Dict[str, Any]) -> None:
    tok = tokenizers["smollm2"]
    text = "Thought: think.\nObservation: 42\nFinal"
    ids = tok.encode(text)
    assert not any("Observation:" in tok.decode([t]) for t in ids)  # 它横跨好几个 token
    d = DetokenizeManager(tok)
    d.add_request(0, prompt_tokens=11, stop=["Observation:", "never"])
    replies = feed(d, ids)
    assert text_of(replies) == "Thought: think.\n"
    last = replies[-1]
    assert (last.finished, last.finish_reason, last.prompt_tokens, last.completion_tokens) == \
        (True, "stop", 11, len(replies))
    assert all(not r.finished for r in replies[:-1]) and len(replies) < len(ids)
    assert d.detokenize(DetokenizeMsg(0, ids[-1], False)) is None  # 调度器停下之前路上的 token：丢掉
    assert d.detokenize(DetokenizeMsg(0, 0, True, "abort")) is None and 0 not in d.forgotten


def test_stop_prefix_is_held_only_while_it_could_match(tokenizers: Dict[str, Any]) -> None:
    tok = tokenizers["smollm2"]
    d = DetokenizeManager(tok)
    d.add_request(0, stop=["\n\n"])
    ids = tok.encode("a\nb\n\nc")
    assert [tok.decode([t]) for t in ids] == ["a", "\n", "b", "\n", "\n", "c"]
    replies = [d.detokenize(DetokenizeMsg(0, t, False)) for t in ids[:5]]
    # "\n" 可能是 "\n\n" 的开头：扣着；"b" 一来就确定不是，和 "b" 一起发出；第二个 "\n" 到了才命中
    assert [r.incremental_output for r in replies] == ["a", "", "\nb", "", ""]
    assert [r.finished for r in replies] == [False] * 4 + [True] and replies[-1].finish_reason == "stop"


@pytest.mark.parametrize("name", ["qwen3", "smollm2"])
def test_stop_strings_random(tokenizers: Dict[str, Any], name: str) -> None:
    tok = tokenizers[name]
    for seed in range(200):
        rng = random.Random(seed)
        ids = tok.encode("".join(rng.choice(TEXTS) for _ in range(3)), add_special_tokens=False)
        one_shot = tok.decode(ids, skip_special_tokens=True)
        stops = []
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(one_shot))
            stops.append(one_shot[i : i + rng.randint(1, 6)] if rng.random() < 0.7 else rng.choice(["zz", "🚀🚀", "。。"]))
        # 参照：生成在第一个"某个 stop 字符串已经完整出现"的 token 上停下，文字截在那时出现的 stop 里最靠前的一个前面
        # （两个 stop 字符串交叠时，后开始、先写完的那个赢：生成不会为了等另一个写完而继续）
        hits: List[int] = []
        for n in range(1, len(ids) + 1):
            prefix = tok.decode(ids[:n], skip_special_tokens=True)
            if hits := [i for s in stops if (i := prefix.find(s)) >= 0]:
                break
        d = DetokenizeManager(tok)
        d.add_request(0, stop=stops)
        replies = feed(d, ids)
        want = prefix[: min(hits)] if hits else one_shot
        assert text_of(replies) == want, f"seed {seed}: stops {stops}"
        assert replies[-1].finish_reason == ("stop" if hits else "length")


def test_a_complete_stop_wins_over_a_partial_one(tokenizers: Dict[str, Any]) -> None:
    """一个 stop 字符串已经完整出现时，另一个从它前面开始、还没写完的 stop 字符串不能把它扣住：文字截在完整的
    那个前面，在它出现的那个 token 上就结束。"""
    tok = tokenizers["qwen3"]
    ids = tok.encode(" Paris.\n\nThe answer is", add_special_tokens=False)
    n = next(i for i in range(1, len(ids) + 1) if "ris" in tok.decode(ids[:i]))  # "ris" 在第 n 个 token 上出现
    for stops in (["ris"], ["ris", " Paris.\n\nThe"], ["ris", " Paris.XYZ"], [" Paris.\n\nThe", "ris"]):
        d = DetokenizeManager(tok)
        d.add_request(0, stop=stops)
        replies = feed(d, ids)
        assert text_of(replies) == " Pa" and replies[-1].finish_reason == "stop", stops
        assert len(replies) == n, stops  # 一个 token 一条回复：第 n 个 token 就停了


def test_finish_reasons_and_usage(tokenizers: Dict[str, Any]) -> None:
    tok = tokenizers["qwen3"]
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    ids = tok.encode("好的")
    d = DetokenizeManager(tok)
    d.add_request(1, prompt_tokens=20)
    r = feed(d, ids + [eos], uid=1, finish_reason="stop")
    assert text_of(r) == "好的" and r[-1].finish_reason == "stop"
    assert (r[-1].prompt_tokens, r[-1].completion_tokens) == (20, len(ids) + 1)  # EOS 也是生成的 token
    # 用户指定的 stop token 可能是普通 token："stop" 结束时不显示最后一个 token，"length" 结束时显示
    assert text_of(feed(DetokenizeManager(tok), ids, finish_reason="stop")) == tok.decode(ids[:-1])
    assert text_of(feed(DetokenizeManager(tok), ids, finish_reason="length")) == tok.decode(ids)
    d = DetokenizeManager(tok)  # 调度器中止（提示词太长、客户端断开）：最后一条消息不带 token
    d.add_request(2, prompt_tokens=3)
    r = feed(d, tok.encode("好的，") + [-1], uid=2, finish_reason="abort")
    assert text_of(r) == "好的，" and r[-1].finish_reason == "abort"
    assert r[-1].completion_tokens == len(tok.encode("好的，")) and not d.states


@pytest.mark.parametrize("name", ["qwen3", "smollm2"])
def test_token_bytes_concatenate_to_the_text(tokenizers: Dict[str, Any], name: str) -> None:
    """每个 token 的 bytes 接起来就是文字的 UTF-8（一个字符切成几个 token 时，每个 token 是它的一部分字节）。"""
    tok = tokenizers[name]
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        parts = [token_bytes(tok, t) for t in ids]
        assert b"".join(parts) == text.encode(), text
    assert token_bytes(tok, tok.convert_tokens_to_ids("<|im_end|>")) == b"<|im_end|>"
    assert token_bytes(tok, len(tok) + 10**6) == b""  # 词表之外的 id（随机权重的模型会生成）


def lp(t: int) -> float:
    return -t / 1e6  # 从 logprob 认得出是哪个 token


def feed_with_logprobs(d: DetokenizeManager, ids: List[int]) -> List[UserReply]:
    replies = []
    for i, t in enumerate(ids):
        last = i == len(ids) - 1
        r = d.detokenize(DetokenizeMsg(0, t, last, "length" if last else None, cached_tokens=7 if i == 0 else 0,
                                       logprob=lp(t), top_ids=[t, 0], top_logprobs=[lp(t), -float("inf")]))
        if r is not None:
            replies.append(r)
            if r.finished:
                break
    return replies


@pytest.mark.parametrize("name", ["qwen3", "smollm2"])
def test_logprobs_follow_the_text(tokenizers: Dict[str, Any], name: str) -> None:
    """每条回复带的 logprobs 正好是它的文字用到的 token：扣着的半个字符、扣着的 stop 字符串开头，它们的 token
    也扣着；stop 截断之后的 token 不出现。bytes 接起来和发出的文字对得上。"""
    tok = tokenizers[name]
    for seed in range(150):
        rng = random.Random(seed)
        ids = tok.encode("".join(rng.choice(TEXTS[:6]) for _ in range(2)), add_special_tokens=False)
        one_shot = tok.decode(ids)
        stop = [] if seed % 3 == 0 else [one_shot[(i := rng.randrange(len(one_shot))): i + rng.randint(1, 4)]]
        d = DetokenizeManager(tok)
        d.add_request(0, stop=stop)
        replies = feed_with_logprobs(d, ids)
        sent, entries = b"", []
        for r in replies:
            sent += r.incremental_output.encode()
            entries += r.logprobs
            got = b"".join(bytes(e["bytes"]) for e in entries)
            if not r.finished:  # 发出去的 token 的字节，是发出去的文字的开头
                assert sent.startswith(got), f"seed {seed}: {got!r} is ahead of {sent!r}"
        got = b"".join(bytes(e["bytes"]) for e in entries)
        hit = replies[-1].finish_reason == "stop"
        # 被 stop 截断时，跨过截断点的那一段文字的 token 也在（它们贡献了发出去的字符）；否则正好对上
        assert got.startswith(sent) and one_shot.encode().startswith(got) if hit else got == sent, f"seed {seed}"
        assert [e["logprob"] for e in entries] == [lp(t) for t in ids[:len(entries)]]  # 按顺序、不重不漏
        assert all(e["top_logprobs"][0]["logprob"] == e["logprob"] and e["top_logprobs"][1]["logprob"] == -9999.0
                   for e in entries)
        assert replies[-1].cached_tokens == 7 and all(r.cached_tokens == 0 for r in replies[:-1])
        offsets = [e["text_offset"] for e in entries]  # 字符位置，不是 token 显示成的字符串的长度之和
        assert offsets == sorted(offsets) and all(0 <= o <= len(one_shot) for o in offsets), f"seed {seed}"
        for e, o in zip(entries, offsets):
            with contextlib.suppress(UnicodeDecodeError):  # 半个字符的 token 没有自己的文字
                assert one_shot.startswith(bytes(e["bytes"]).decode(), o), f"seed {seed}: {e['token']!r} at {o}"


def test_logprob_entries_in_openai_shape(tokenizers: Dict[str, Any]) -> None:
    tok = tokenizers["smollm2"]
    ids = tok.encode("鸭")  # 一个汉字，三个字节级 token
    replies = feed_with_logprobs(DetokenizeManager(tok), ids)
    assert [len(r.logprobs) for r in replies] == [0] * (len(ids) - 1) + [len(ids)]  # 和字一起到
    first = replies[-1].logprobs[0]
    assert set(first) == {"token", "bytes", "logprob", "top_logprobs", "text_offset"} and first["token"].startswith("\\x")
    assert bytes(sum((e["bytes"] for e in replies[-1].logprobs), [])).decode() == "鸭"
    assert [e["text_offset"] for e in replies[-1].logprobs] == [0] * len(ids)  # 三个 token 都指向这一个字
    assert feed(DetokenizeManager(tok), ids)[-1].logprobs is None  # 没要 logprobs


def test_routing_in_one_process(tokenizers: Dict[str, Any]) -> None:
    """--num-tokenizer 0：同一个进程分词、反分词。"""
    tok = tokenizers["qwen3"]
    loop = TokenizerLoop(tok)
    out = loop.step([TokenizeMsg(1, "Count:", SamplingParams(), stop=["3"]), TokenizeMsg(2, "Hi", SamplingParams())])
    assert [type(m) for m in out.backend] == [UserMsg, UserMsg] and not out.frontend and not out.detokenizer
    assert loop.detokenize_manager.states[1].prompt_tokens == len(tok.encode("Count:"))
    step = [DetokenizeMsg(1, t, False) for t in tok.encode(" 1 2 3 4")] + [DetokenizeMsg(2, t, False) for t in tok.encode("!")]
    out = loop.step(step)
    assert out.backend == [AbortBackendMsg(uid=1)]  # stop 命中：让调度器停下，只发一次
    assert "".join(r.incremental_output for r in out.frontend if r.uid == 1) == " 1 2 "
    assert [r.finish_reason for r in out.frontend if r.finished] == ["stop"]
    assert loop.step([DetokenizeMsg(1, 5, False)]).frontend == []  # 之后到达的 token 丢掉
    out = loop.step([AbortMsg(uid=2)])  # 客户端走了
    assert out.backend == [AbortBackendMsg(uid=2)] and 2 not in loop.detokenize_manager.states
    assert loop.step([DetokenizeMsg(2, 5, False)]).frontend == []
    out = loop.step([TokenizeMsg(3, "", SamplingParams())])  # 坏请求只结束它自己，原因写在 error 里
    assert out.frontend == [UserReply(uid=3, incremental_output="", finished=True, finish_reason="abort",
                                      error="the prompt is empty after tokenization")]
    with pytest.raises(TypeError, match="UserMsg"):
        loop.step([UserMsg(0, torch.zeros(1, dtype=torch.int32), SamplingParams())])  # type: ignore[list-item]


def test_routing_with_a_separate_tokenizer(tokenizers: Dict[str, Any]) -> None:
    """--num-tokenizer N > 0：tokenizer 把登记信息和中止转给 detokenizer；调度器的中止由 tokenizer 自己发，
    和 UserMsg 同一个套接字，不会抢在请求前面到达调度器。"""
    tok = tokenizers["qwen3"]
    tokenizer, detokenizer = TokenizerLoop(tok, to_detokenizer=True), TokenizerLoop(tok, wait_for_info=True)
    out = tokenizer.step([TokenizeMsg(1, "Count:", SamplingParams(), stop=["3"])])
    assert out.detokenizer == [DetokenizeInfoMsg(uid=1, prompt_tokens=len(tok.encode("Count:")), stop=["3"])]
    assert [m.uid for m in out.backend] == [1] and not tokenizer.detokenize_manager.states
    detokenizer.step(out.detokenizer)
    assert detokenizer.detokenize_manager.states[1].stop == ["3"]
    out = tokenizer.step([AbortMsg(uid=1)])
    assert out.detokenizer == [AbortMsg(uid=1)] and out.backend == [AbortBackendMsg(uid=1)]
    assert detokenizer.step(out.detokenizer).backend == []  # detokenizer 只忘掉状态：调度器已经收到了
    assert not detokenizer.detokenize_manager.states
    ids = tok.encode("1 2 3 4")  # 全部 token 都先于登记到达（负载重时真会发生）：先存着，登记一到照样在 stop 前截断
    steps = [detokenizer.step([DetokenizeMsg(2, t, False)]) for t in ids]
    assert all(not o.frontend and not o.backend for o in steps) and len(detokenizer.early[2]) == len(ids)
    out = detokenizer.step([DetokenizeInfoMsg(uid=2, prompt_tokens=4, stop=["3"])])
    assert "".join(r.incremental_output for r in out.frontend) == "1 2 " and not detokenizer.early
    assert out.frontend[-1].finish_reason == "stop" and out.frontend[-1].prompt_tokens == 4
    assert out.backend == [AbortBackendMsg(uid=2)]
    assert detokenizer.step([DetokenizeMsg(2, 5, False)]).frontend == [] and not detokenizer.early  # 中止之后的丢掉
    eager = TokenizerLoop(tok)  # 不等登记的话，stop 字符串来不及生效：这就是 wait_for_info 要防的
    early = eager.step([DetokenizeMsg(3, t, False) for t in ids]).frontend
    eager.step([DetokenizeInfoMsg(uid=3, prompt_tokens=4, stop=["3"])])
    assert "".join(r.incremental_output for r in early) == "1 2 3 4" and not any(r.finished for r in early)


def unwrap(msg: Any) -> List[Any]:
    return msg.data if isinstance(msg, (BatchBackendMsg, BatchFrontendMsg)) else [msg]


@pytest.mark.parametrize("num_tokenizer", [0, 1])
def test_worker_over_zmq(tokenizers: Dict[str, Any], num_tokenizer: int) -> None:
    tok = tokenizers["qwen3"]
    d = tempfile.mkdtemp(prefix="tok")
    tok_addr, detok_addr, backend_addr, frontend_addr = (f"ipc://{d}/{n}" for n in ("t", "d", "b", "f"))
    backend: ZmqPullQueue = ZmqPullQueue(backend_addr, create=True)  # 调度器
    frontend: ZmqPullQueue = ZmqPullQueue(frontend_addr, create=True)  # API Server
    ctx = mp.get_context("spawn")
    ack = ctx.Queue()
    common = dict(tokenizer_path=str(qwen3_tokenizer_dir()), backend_addr=backend_addr, frontend_addr=frontend_addr,
                  local_bs=4, ack_queue=ack)
    procs = [ctx.Process(target=tokenize_worker, kwargs=dict(common, addr=detok_addr, create=True,
                                                            tokenizer_id=num_tokenizer,
                                                            wait_for_info=num_tokenizer > 0))]
    procs += [ctx.Process(target=tokenize_worker, kwargs=dict(common, addr=tok_addr, create=True, tokenizer_id=i,
                                                             detokenizer_addr=detok_addr)) for i in range(num_tokenizer)]
    for p in procs:
        p.start()
    api: ZmqPushQueue = ZmqPushQueue(tok_addr if num_tokenizer else detok_addr, create=False)
    scheduler: ZmqPushQueue = ZmqPushQueue(detok_addr, create=False)
    try:
        assert len({ack.get(timeout=120) for _ in procs}) == len(procs)
        chat = [{"role": "user", "content": "数到四"}]
        api.put(TokenizeMsg(1, chat, SamplingParams(), chat_options={"enable_thinking": False}, stop=["三"]))
        api.put(TokenizeMsg(2, "1, 2,", SamplingParams(max_tokens=9)))
        users: Dict[int, UserMsg] = {}
        while len(users) < 2:
            users.update((m.uid, m) for m in unwrap(backend.get(timeout=60)))
        want = TokenizeManager(tok).encode(chat, {"enable_thinking": False})
        assert users[1].input_ids.tolist() == want and users[2].input_ids.tolist() == tok.encode("1, 2,")
        assert users[2].sampling_params.max_tokens == 9
        ans1 = tok.encode("一、二、三、四")
        ans2 = tok.encode(" 3, 4") + [tok.convert_tokens_to_ids("<|im_end|>")]
        for i in range(max(len(ans1), len(ans2))):  # 调度器每步给每个请求一个 token
            step = [DetokenizeMsg(1, ans1[i], False)] if i < len(ans1) else []
            if i < len(ans2):
                last = i == len(ans2) - 1
                step.append(DetokenizeMsg(2, ans2[i], last, "stop" if last else None))
            scheduler.put(BatchTokenizerMsg(step))
        texts: Dict[int, str] = {1: "", 2: ""}
        final: Dict[int, UserReply] = {}
        while len(final) < 2:
            for r in unwrap(frontend.get(timeout=60)):
                assert r.uid not in final, "a reply after the request finished"
                texts[r.uid] += r.incremental_output
                if r.finished:
                    final[r.uid] = r
        assert texts == {1: "一、二、", 2: " 3, 4"}
        assert final[1].finish_reason == final[2].finish_reason == "stop"
        assert (final[2].prompt_tokens, final[2].completion_tokens) == (len(users[2].input_ids), len(ans2))
        assert unwrap(backend.get(timeout=60)) == [AbortBackendMsg(uid=1)]  # stop 字符串让调度器停下
        api.put(TokenizeMsg(3, "x", SamplingParams()))
        assert [m.uid for m in unwrap(backend.get(timeout=60))] == [3]
        api.put(AbortMsg(uid=3))  # 客户端断开
        assert unwrap(backend.get(timeout=60)) == [AbortBackendMsg(uid=3)]
        assert backend.empty() and frontend.empty()
    finally:
        for p in procs:
            p.terminate()
            p.join(30)
        for q in (api, scheduler, backend, frontend):
            q.stop()


def test_new_request_jumps_the_detokenize_backlog(tokenizers: Dict[str, Any]) -> None:
    """几百步的 token 排在队列里时来了一个新请求：它的 UserMsg 先于这些 token 的绝大部分回复发出。"""
    tok = tokenizers["qwen3"]
    d = tempfile.mkdtemp(prefix="tok")
    addr, out_addr = f"ipc://{d}/in", f"ipc://{d}/out"
    out: ZmqPullQueue = ZmqPullQueue(out_addr, create=True)  # 调度器和 API Server 的消息都到这里
    ctx = mp.get_context("spawn")
    ack = ctx.Queue()
    proc = ctx.Process(target=tokenize_worker, kwargs=dict(
        tokenizer_path=str(qwen3_tokenizer_dir()), addr=addr, create=True, backend_addr=out_addr,
        frontend_addr=out_addr, ack_queue=ack))
    proc.start()
    send: ZmqPushQueue = ZmqPushQueue(addr, create=False)
    try:
        ack.get(timeout=120)
        ids, steps = tok.encode(" ".join(TEXTS)), 1000
        wire = [encode(BatchTokenizerMsg([DetokenizeMsg(100 + u, ids[(i + u) % len(ids)], False) for u in range(64)]))
                for i in range(steps)]  # 先编码好，发的时候只是写字节：新请求紧跟在 1,000 步之后到达
        for w in wire:
            send.put_raw(w)
        send.put(TokenizeMsg(1, "x", SamplingParams()))
        replies = 0
        while not any(isinstance(m, UserMsg) for m in unwrap(out.get(timeout=60))):
            replies += 1
        assert replies < steps // 4, f"the new request waited behind {replies} of {steps} steps of tokens"
    finally:
        proc.terminate()
        proc.join(30)
        send.stop()
        out.stop()


def check_idle(llm: LLM) -> None:
    """一次 generate 之后：槽、运行中的请求、detokenizer 的状态、收结果的字典都回来，缓存的账对得上。"""
    assert llm.table.num_free == llm.config.max_running_req and not llm.running and not llm.prefill.pending
    assert not llm.detokenize_manager.states and not llm.detokenize_manager.forgotten
    assert not (llm._outputs or llm._done or llm._texts or llm._hit)
    llm.cache.check_integrity()


def piece(text: str, start: int, width: int) -> str:
    """text 里从 start 起第一段不含 U+FFFD 的 width 个字符（随机模型会写出半个字符）。"""
    return next(text[i:i + width] for i in range(start, len(text)) if "\ufffd" not in text[i:i + width])


@pytest.mark.parametrize("overlap", [False, True])
def test_offline_chat_and_stop_strings(tiny_qwen3, overlap: bool) -> None:
    llm = LLM(tiny_qwen3, device="cpu", page_size=4, num_pages=1024, max_running_req=4, max_seq_len_override=512,
              enable_overlap=overlap)
    try:
        tok = llm.tokenizer
        chat = [{"role": "user", "content": "数到十"}]
        greedy = SamplingParams(max_tokens=60, ignore_eos=True)
        ids = TokenizeManager(tok).encode(chat, {"enable_thinking": False})
        llm.generate([ids], SamplingParams(max_tokens=1), use_tqdm=False)  # 先算进缓存：之后每次一样地命中
        full = llm.generate([ids], greedy, use_tqdm=False)[0]
        convs = llm.chat([chat, chat[:1]], greedy, use_tqdm=False, chat_template_kwargs={"enable_thinking": False})
        assert [o["token_ids"] for o in convs] == [full["token_ids"]] * 2  # 一组对话，和先套模板再 generate 一样
        assert [o["text"] for o in convs] == [full["text"]] * 2
        text, out = full["text"], full["token_ids"]
        assert text == tok.decode(out, skip_special_tokens=True)
        step, steps = llm.run_step, [0]

        def counting() -> bool:
            steps[0] += 1
            return step()

        llm.run_step = counting  # type: ignore[method-assign]
        for stops in ([piece(text, 20, 3)], [piece(text, 40, 1), "never written"], "never written"):
            steps[0] = 0
            got = llm.generate([ids], greedy, use_tqdm=False, stop=stops)[0]
            stops = [stops] if isinstance(stops, str) else stops
            # 参照：第 13 章 test_stop_strings_random 的规则——第一个让某个 stop 完整出现的 token 上停下
            k = next((i for i in range(1, len(out) + 1)
                      if any(s in tok.decode(out[:i], skip_special_tokens=True) for s in stops)), None)
            if k is None:
                assert (got["text"], got["token_ids"], got["finish_reason"]) == (text, out, "length")
            else:
                prefix = tok.decode(out[:k], skip_special_tokens=True)
                assert got["text"] == prefix[:min(i for s in stops if (i := prefix.find(s)) >= 0)]
                assert (got["token_ids"], got["finish_reason"]) == (out[:k], "stop")
                assert steps[0] <= k + 5 < len(out)  # 调度器真的停下了，不是生成完再截（重叠时结果晚一步，中止后收尾几步）
            check_idle(llm)
        del llm.run_step
        # 用户给的 stop token 是个普通的词：和服务一样，不进文字
        got = llm.generate([ids], SamplingParams(max_tokens=60, stop_token_ids=[out[5]]), use_tqdm=False)[0]
        first = out.index(out[5])
        assert (got["token_ids"], got["finish_reason"]) == (out[:first + 1], "stop")
        assert got["text"] == tok.decode(out[:first], skip_special_tokens=True)
        check_idle(llm)
    finally:
        llm.shutdown()


def test_offline_n_answers(tiny_qwen3) -> None:
    llm = LLM(tiny_qwen3, device="cpu", page_size=4, num_pages=1024, max_running_req=8, max_seq_len_override=256)
    try:
        prompts = ["一二三", "Hello there"]
        llm.generate(prompts, SamplingParams(max_tokens=1), use_tqdm=False)  # 先算进缓存：之后每次命中得一样
        sp = SamplingParams(temperature=1.0, max_tokens=12, seed=2**63 - 2, ignore_eos=True)
        many = llm.generate(prompts, sp, use_tqdm=False, n=3)
        assert len(many) == 6 and len({tuple(o["token_ids"]) for o in many}) == 6  # 各不相同
        for p, prompt in enumerate(prompts):  # 第 p 个提示词的第 j 个回答：和单独发 seed + j（回绕）的一样
            for j in range(3):
                alone = llm.generate(prompt, nth_sample(sp, j), use_tqdm=False)[0]
                assert many[p * 3 + j]["token_ids"] == alone["token_ids"], (p, j)
        assert [nth_sample(sp, j).seed for j in range(3)] == [2**63 - 2, 2**63 - 1, -2**63]
        assert nth_sample(SamplingParams(), 5) == SamplingParams()  # 没给 seed：原样
        greedy = llm.generate(prompts[0], SamplingParams(max_tokens=8), use_tqdm=False, n=2)
        assert greedy[0] == {**greedy[1], "cached_tokens": greedy[0]["cached_tokens"]}
        check_idle(llm)
        for bad, error, match in [(dict(n=0), ValueError, "n=0 must be an integer >= 1"),
                                  (dict(n=True), ValueError, "n=True"), (dict(n=1.5), ValueError, "n=1.5"),
                                  (dict(stop=5), TypeError, "stop must be a string or a list of strings"),
                                  (dict(stop=["a", None]), TypeError, "stop must be")]:
            with pytest.raises(error, match=match):
                llm.generate(prompts, **bad)
        for bad in ("hi", [[]], 5, [["not a message"]]):
            with pytest.raises(TypeError, match="conversations must be"):
                llm.chat(bad)
        for bad in ([{"content": "no role"}], [{"role": "user"}], [{"role": "user", "content": None}],
                    [{"role": "user", "content": [{"type": "text", "text": "parts"}]}]):
            with pytest.raises(TypeError, match="a message needs a string 'role' and a string 'content'"):
                llm.chat(bad)
        with pytest.raises(TypeError, match="chat_template_kwargs must be a dict"):
            llm.chat([{"role": "user", "content": "hi"}], chat_template_kwargs=["x"])
        check_idle(llm)
    finally:
        llm.shutdown()


def test_offline_threads_take_turns(tiny_qwen3) -> None:
    """两个线程同时 generate（同一个 LLM），三轮：轮流来，每个线程拿到和单独调用一样的 token；之后槽、页和收结果的
    字典都回来。没有锁时两个循环抢着推同一个调度器，报 forward_batch is not re-entrant 或 KeyError，之后每次都失败。"""
    llm = LLM(tiny_qwen3, device="cpu", page_size=4, num_pages=1024, max_running_req=8, max_seq_len_override=256)
    try:
        prompts = [["一二三", "Hello there"], ["The capital of France is", "数到十"]]
        llm.generate(prompts[0] + prompts[1], SamplingParams(max_tokens=1), use_tqdm=False)  # 先进缓存
        sp = SamplingParams(max_tokens=16, ignore_eos=True)
        want = {i: [o["token_ids"] for o in llm.generate(p, sp, use_tqdm=False)] for i, p in enumerate(prompts)}
        for _ in range(3):
            got: Dict[int, Any] = {}

            def run(i: int) -> None:
                try:
                    got[i] = [o["token_ids"] for o in llm.generate(prompts[i], sp, use_tqdm=False)]
                except Exception as e:  # 线程里的异常不会自己传出来
                    got[i] = repr(e)

            threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=120)
            assert got == want
        check_idle(llm)
    finally:
        llm.shutdown()
