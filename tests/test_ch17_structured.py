# Tangled from book/chapters/ch17_structured.ipynb — edit the notebook, not this file.
"""附录·结构化输出。语法层（minisgl/structured/）：真实的 Qwen3 与 SmolLM2 分词器，随机生成的 JSON Schema、正则和
EBNF，一个随机 logits 的"模型"在掩码下生成——输出总能解析，并且合乎它的 schema / 正则。接进调度器之后：离线的
LLM 和 python -m minisgl（官方 openai 客户端）在重叠调度、撤回、CUDA Graph 下只写出合法的输出，坏的 spec 回 400。"""
from __future__ import annotations

import ast
import asyncio
import functools
import json
import random
import re
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Literal, NamedTuple, Tuple

import httpx
import pydantic
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai import AsyncOpenAI, BadRequestError, NotFoundError

xgr = pytest.importorskip("xgrammar", reason="xgrammar is not installed: pip install -e '.[structured]'")
jsonschema = pytest.importorskip("jsonschema")

from minisgl.core import SamplingParams  # noqa: E402
from minisgl.llm import LLM  # noqa: E402
from minisgl.message import UserMsg, UserReply, decode, encode  # noqa: E402
from minisgl.server.tools import (ReasoningParser, ToolCallParser, forced_schema, prompt_thinking,  # noqa: E402
                                  template_thinks, template_writes_tool_calls)
from minisgl.structured import (JSON_OBJECT_SCHEMA, Grammar, GrammarBackend, allocate_vocab_mask,  # noqa: E402
                                apply_vocab_mask, check_grammar, fill_vocab_mask, unpack_vocab_mask)
from minisgl.utils.hf import load_tokenizer, qwen3_tokenizer_dir  # noqa: E402
from test_ch15_server import client, metrics, start_server, stop_server  # noqa: E402  (第 15 章：起停服务)

EXAMPLES = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))

class Vocab(NamedTuple):
    tokenizer: Any
    backend: GrammarBackend
    size: int  # 模型的词表大小（掩码的宽度）
    pieces: List[bytes]  # 每个 token 的字节
    closing: torch.Tensor  # [V] float32：含 " } ] ) 的 token 和结束符是 1

@pytest.fixture(scope="module", params=["qwen3", "smollm2"])
def vocab(request) -> Vocab:
    """真实的分词器 + 模型的词表大小：Qwen3 的 151936 比它分词器的 151669 大，多出来的 id 永远不该被允许。"""
    if request.param == "qwen3":
        path, size = qwen3_tokenizer_dir(), 151936
    else:
        path = request.getfixturevalue("smollm2")
        size = json.loads((path / "config.json").read_text())["vocab_size"]
    tokenizer = load_tokenizer(path)
    backend = GrammarBackend(tokenizer, size, max_threads=1)
    pieces = list(backend.info.decoded_vocab)
    closing = torch.tensor([float(any(c in p for c in b'"}])')) for p in pieces] + [0.0] * (size - len(pieces)))
    closing[backend.stop_token_ids] = 1.0
    return Vocab(tokenizer, backend, size, pieces, closing)

def generate(v: Vocab, grammar: Grammar, seed: int, bias: float, max_steps: int = 400) -> str:
    """随机 logits 的"模型"：噪声 + bias × closing（bias 随步数变大，输出迟早收尾）；掩码之外的 token 一个也采不到。
    返回到结束符为止的文本：逐 token 拼字节得到的，和分词器解码的必须一样。"""
    gen = torch.Generator().manual_seed(seed)
    mask = allocate_vocab_mask(1, v.size)
    tokens: List[int] = []
    while not grammar.is_terminated:
        assert len(tokens) < max_steps, f"no end after {max_steps} tokens: {v.tokenizer.decode(tokens)!r}"
        grammar.fill(mask, 0)
        logits = torch.randn(1, v.size, generator=gen) + bias * (1 + len(tokens) / 50) * v.closing  # [1, V]
        apply_vocab_mask(logits, mask)
        token = int(logits.argmax())
        assert grammar.accept(token), f"the grammar refused token {token}, which its own mask allowed"
        tokens.append(token)
    assert tokens[-1] in v.backend.stop_token_ids
    text = b"".join(v.pieces[t] for t in tokens[:-1]).decode("utf-8")  # 不完整的 UTF-8 在这里就会抛异常
    assert v.tokenizer.decode(tokens[:-1]) == text
    return text


names = st.text(st.sampled_from('abxyz_09 é"\\'), min_size=1, max_size=6)  # 引号和反斜杠：键和值都要转义
scalars = st.one_of(st.none(), st.booleans(), st.integers(-1000, 1000), names)
leaves = st.one_of(
    st.builds(lambda n: {"type": "string"} if n is None else {"type": "string", "maxLength": n},
              st.none() | st.integers(0, 8)),
    st.builds(lambda lo, span: {"type": "integer"} if lo is None else {"type": "integer", "minimum": lo,
                                                                      "maximum": lo + span},
              st.none() | st.integers(-50, 50), st.integers(0, 300)),
    st.sampled_from([{"type": "number"}, {"type": "boolean"}, {"type": "null"}]),
    st.lists(scalars, min_size=1, max_size=4, unique_by=json.dumps).map(lambda v: {"enum": v}),
    scalars.map(lambda v: {"const": v}),
)

def containers(children: st.SearchStrategy) -> st.SearchStrategy:
    arrays = st.builds(lambda items, lo, extra: {"type": "array", "items": items, "minItems": lo,
                                                 **({} if extra is None else {"maxItems": lo + extra})},
                       children, st.integers(0, 2), st.none() | st.integers(0, 3))
    objects = st.dictionaries(names, children, min_size=1, max_size=4).flatmap(
        lambda props: st.lists(st.sampled_from(sorted(props)), unique=True).map(
            lambda required: {"type": "object", "properties": props, "required": required,
                              "additionalProperties": False}))
    return arrays | objects

schemas = containers(st.recursive(leaves, containers, max_leaves=8))  # 根是对象或数组，里面任意嵌套

@EXAMPLES
@given(schema=schemas, seed=st.integers(0, 2**31), bias=st.sampled_from([2.0, 4.0, 8.0]))
def test_random_schemas_parse_and_validate(vocab: Vocab, schema: dict, seed: int, bias: float) -> None:
    """随机的 schema（对象、数组、嵌套、必填与可选、枚举、常量、范围、长度）：随机模型的输出总能解析、并通过校验。"""
    text = generate(vocab, vocab.backend.grammar("json_schema", json.dumps(schema)), seed, bias)
    jsonschema.validate(json.loads(text), schema)


SYNTAX = {"regex": (str, "", "|"), "ebnf": (json.dumps, " ", " | ")}  # 字面量的写法、连接符、"或"的分隔符


def render(node: tuple, syntax: str) -> str:
    """同一棵树写成正则（syntax="regex"）或 EBNF（"ebnf"）：两者描述同一个语言。"""
    lit, cat, alt = SYNTAX[syntax]
    kind, *args = node
    if kind == "lit":
        return lit(args[0])
    if kind == "class":
        return f"[{args[0]}]"
    if kind in ("seq", "alt"):
        joined = (cat if kind == "seq" else alt).join(f"({render(n, syntax)})" for n in args[0])
        return joined if kind == "seq" else f"({joined})"
    return f"({render(args[0], syntax)}){args[1]}"


patterns = st.recursive(
    st.tuples(st.just("lit"), st.text(st.sampled_from("abxyz019"), min_size=1, max_size=3))
    | st.tuples(st.just("class"), st.sampled_from(["a-c", "0-9", "xyz"])),
    lambda kids: st.tuples(st.just("seq"), st.lists(kids, min_size=2, max_size=3))
    | st.tuples(st.just("alt"), st.lists(kids, min_size=2, max_size=3))
    | st.tuples(st.just("rep"), kids, st.sampled_from(["?", "*", "+", "{1,3}", "{2}"])),
    max_leaves=6)

@EXAMPLES
@given(node=patterns, seed=st.integers(0, 2**31), kind=st.sampled_from(["regex", "ebnf"]))
def test_random_regex_and_ebnf_fullmatch(vocab: Vocab, node: tuple, seed: int, kind: str) -> None:
    """随机的正则（字面量、字符类、拼接、选择、? * + {m,n}），以正则或等价的 EBNF 给出：输出被 re.fullmatch 接受。"""
    spec = render(node, "regex") if kind == "regex" else "root ::= " + render(node, "ebnf")
    text = generate(vocab, vocab.backend.grammar(kind, spec), seed, bias=4.0)
    assert re.fullmatch(render(node, "regex"), text), (spec, text)

ARITH = 'root ::= expr\nexpr ::= term (("+" | "*") term)*\nterm ::= num | "(" expr ")"\nnum ::= [1-9] [0-9]?'

@pytest.mark.parametrize("seed", range(6))
def test_recursive_ebnf_balances_parentheses(vocab: Vocab, seed: int) -> None:
    """递归的语法（括号可以任意深）正则写不出来：输出是 Python 能解析的算式，只含 + * 和整数。"""
    text = generate(vocab, vocab.backend.grammar("ebnf", ARITH), seed, bias=3.0)
    tree = ast.parse(text, mode="eval")
    assert all(isinstance(n, (ast.Expression, ast.BinOp, ast.Constant, ast.Add, ast.Mult)) for n in ast.walk(tree))

@pytest.mark.parametrize("seed", range(6))
def test_json_object_is_any_object(vocab: Vocab, seed: int) -> None:
    """response_format json_object：任意 JSON 对象（键、值、嵌套都不限），输出解析出来是 dict。"""
    text = generate(vocab, vocab.backend.grammar("json_schema", JSON_OBJECT_SCHEMA), seed, bias=3.0)
    assert isinstance(json.loads(text), dict), text

def test_mask_bits_are_what_the_grammar_accepts(vocab: Vocab) -> None:
    """走到字符串中间：掩码里为 1 的 token（按我们的解包顺序），accept 都接受；为 0 的都拒绝。特殊 token、
    分词器之外的填充 id 一律为 0；对象写完之后只剩结束符。"""
    spec = json.dumps({"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]})
    prefix = vocab.tokenizer.encode('{"name": "Ab', add_special_tokens=False)

    def at_prefix() -> Grammar:
        g = vocab.backend.grammar("json_schema", spec)
        assert all(g.accept(t) for t in prefix)
        return g

    mask = allocate_vocab_mask(1, vocab.size)
    at_prefix().fill(mask, 0)
    allowed = unpack_vocab_mask(mask, vocab.size)[0]  # [V] bool
    rng = random.Random(0)
    yes, no = allowed.nonzero().flatten().tolist(), (~allowed).nonzero().flatten().tolist()
    for token in rng.sample(yes, 30) + rng.sample(no, 30):
        assert at_prefix().accept(token) == bool(allowed[token]), token
    special = [t for t in vocab.tokenizer.all_special_ids if t not in vocab.backend.stop_token_ids]
    assert not allowed[special].any() and not allowed[len(vocab.tokenizer):].any()
    done = vocab.backend.grammar("json_schema", spec)
    assert all(done.accept(t) for t in vocab.tokenizer.encode('{"name": "x"}', add_special_tokens=False))
    done.fill(mask, 0)
    assert unpack_vocab_mask(mask, vocab.size)[0].nonzero().flatten().tolist() == vocab.backend.stop_token_ids

def test_apply_vocab_mask_matches_xgrammar() -> None:
    """我们的纯 torch 实现和 xgrammar 的 kernel 结果相同：随机掩码，词表不是 32 的倍数（最后一个字只用一部分）。"""
    gen = torch.Generator().manual_seed(0)
    for vocab_size in (151936, 1000, 33):
        mask = torch.randint(-2**31, 2**31 - 1, (3, (vocab_size + 31) // 32), dtype=torch.int32, generator=gen)
        logits = torch.randn(3, vocab_size, generator=gen)
        ours, theirs = logits.clone(), logits.clone()
        apply_vocab_mask(ours, mask)
        xgr.apply_token_bitmask_inplace(theirs, mask)
        assert torch.equal(ours, theirs)
        assert torch.equal(ours.isinf(), ~unpack_vocab_mask(mask, vocab_size))
    one = allocate_vocab_mask(2, 70)
    one[1] = 0
    one[1, 2] = 1 << 5  # 只允许 token 2 * 32 + 5 = 69
    assert unpack_vocab_mask(one, 70)[0].all() and unpack_vocab_mask(one, 70)[1].nonzero().flatten().tolist() == [69]

def test_compiled_once_per_spec_lru(smollm2) -> None:
    """同一个 (kind, spec) 只编译一次、拿到的是同一个对象；缓存满了淘汰最久没用的。两个请求的状态互不影响。"""
    tokenizer = load_tokenizer(smollm2)
    backend = GrammarBackend(tokenizer, len(tokenizer), cache_size=2, max_threads=1)
    a = backend.compile("regex", "[a-z]+")
    assert backend.compile("regex", "[a-z]+") is a and (backend.hits, backend.misses) == (1, 1)
    backend.compile("regex", "[0-9]+")
    backend.compile("regex", "[a-z]+")  # 刚用过：它留下，[0-9]+ 成了最久没用的
    backend.compile("ebnf", 'root ::= "x"')
    assert backend.compile("regex", "[a-z]+") is a and (backend.hits, backend.misses) == (3, 3)
    assert backend.compile("regex", "[0-9]+") is not None and backend.misses == 4  # 被淘汰过，重新编译
    g1, g2 = backend.grammar("regex", "ab"), backend.grammar("regex", "ab")
    a_tok, b_tok = (tokenizer.encode(c, add_special_tokens=False)[0] for c in "ab")
    assert g1.accept(a_tok) and g1.accept(b_tok)
    assert not g2.accept(b_tok) and g2.accept(a_tok)  # g2 还在开头

@pytest.mark.parametrize("kind, spec, reason", [
    ("json_schema", '{"type": "objec"}', 'Unsupported type "objec"'),
    ("json_schema", '{"type": ', "is not valid JSON"),
    ("json_schema", "[1, 2]", "should be an object or bool"),
    ("regex", "((", "parenthesis is not closed"),
    ("ebnf", "root ::= foo", 'Rule "foo" is not defined'),
    ("xml", "<a/>", "unknown grammar kind 'xml'"),
    ("regex", "[^\\s\\S]", "no output can satisfy it"),  # 空的字符类：第一步一个 token 也不放行
    ("ebnf", 'root ::= root "x"', "no output can satisfy it"),  # 只能无穷地往左递归
    ("json_schema", '{"anyOf": []}', "anyOf at # has no branches"),
])
def test_bad_specs_raise_value_error_naming_them(vocab: Vocab, kind: str, spec: str, reason: str) -> None:
    """编译不了的 spec：check_grammar（不用分词器）和 compile 都抛 ValueError，信息以 kind=spec 开头、说明原因。"""
    for call in (check_grammar, vocab.backend.compile):
        with pytest.raises(ValueError) as e:
            call(kind, spec)
        assert reason in str(e.value)
        assert kind == "xml" or str(e.value).startswith(f"{kind}={spec!r}")

A_INT, B_INT = ({"type": "object", "properties": {k: {"type": "integer"}}, "required": [k]} for k in "ab")
UNENFORCED = [  # (schema, 违反它、xgrammar 的文法却接受的实例, 报错里的话)
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, [1, 1], "uniqueItems at # is not supported"),
    ({"type": "object", "properties": {"c": {"type": "array", "items": {"enum": ["x", "y"]}, "uniqueItems": True}},
      "required": ["c"]}, {"c": ["x", "x"]}, "uniqueItems at #/properties/c is not supported"),
    ({"allOf": [A_INT, B_INT]}, {"a": 1}, "allOf at # has 2 branches"),
    ({"type": "string", "not": {"const": "x"}}, "x", "not at # is not supported"),
    ({"type": "integer", "if": {"minimum": 5}, "then": {"maximum": 6}}, 9, "if at # is not supported"),
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
      "dependentRequired": {"a": ["b"]}}, {"a": 1}, "dependentRequired at # is not supported"),
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
      "dependentSchemas": {"a": {"required": ["b"]}}}, {"a": 1}, "dependentSchemas at # is not supported"),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, 1, "oneOf at # is not supported"),
    ({"type": "array", "items": {"type": "integer"}, "contains": {"const": 5}}, [1], "contains at # is not supported"),
    ({"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
      "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "dependencies": {"a": ["b"]}}, {"a": 1},
     "dependencies at # is not supported"),
    ({"$defs": {"s": {"$dynamicAnchor": "s", "type": "string"}}, "type": "array", "items": {"$dynamicRef": "#s"}},
     [1], "$dynamicRef at #/items is not supported"),
    ({"$schema": "https://json-schema.org/draft/2019-09/schema", "type": "array", "items": {"$recursiveRef": "#"}},
     [1], "$recursiveRef at #/items is not supported"),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "b"]}, {"a": 1},
     "required at # lists 'b', which is not under properties"),
    ({"type": "string", "anyOf": [{"maxLength": 2}, {"minLength": 5}]}, 5, "type at # is ignored next to anyOf"),
    ({"$defs": {"s": {"type": "string"}}, "$ref": "#/$defs/s", "maxLength": 1}, "abc",
     "maxLength at # is ignored next to $ref"),
    ({"enum": ["a", 1], "type": "string"}, 1, "type at # is ignored next to enum"),
    ({"type": "object", "properties": {"n": {"maxLength": 2}}, "required": ["n"]}, {"n": "abc"},
     "maxLength at #/properties/n needs a type"),
    ({"type": "number", "multipleOf": 0.5}, 0.3, "multipleOf at # is supported only for type integer"),
    ({"type": "string", "format": "regex"}, "((", "format 'regex' at # is not supported"),
]

@pytest.mark.parametrize("schema, instance, reason", UNENFORCED)
def test_schema_keywords_xgrammar_cannot_enforce_are_refused(vocab: Vocab, schema: dict, instance: Any,
                                                              reason: str) -> None:
    """xgrammar 保证不了的关键字：它编出来的文法接受一个违反 schema 的实例——这就是要拒绝的原因；check_grammar 和
    compile 都抛 ValueError，说出关键字和位置。"""
    spec = json.dumps(schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(instance, schema, format_checker=jsonschema.FormatChecker())
    compiled = xgr.GrammarCompiler(vocab.backend.info, max_threads=1).compile_json_schema(spec, any_whitespace=False)
    matcher = xgr.GrammarMatcher(compiled)
    assert matcher.accept_string(json.dumps(instance)) and matcher.is_completed(), "xgrammar enforces it now"
    for call in (check_grammar, vocab.backend.compile):
        with pytest.raises(ValueError) as e:
            call("json_schema", spec)
        assert str(e.value).startswith("json_schema='") and f"': {reason}" in str(e.value), str(e.value)

@pytest.mark.parametrize("schema", [
    {"type": "array", "items": {"type": "integer"}, "uniqueItems": False},
    {"anyOf": [{"type": "string", "maxLength": 3}, {"type": "null"}], "title": "T", "description": "d", "default": None},
    {"$defs": {"c": {"enum": ["r", "g"]}}, "type": "object", "properties": {"c": {"$ref": "#/$defs/c"}},
     "required": ["c"], "additionalProperties": False},
    {"type": "object", "properties": {"a/b": {"type": "string", "enum": ["x"]}}, "required": ["a/b"]},
])
def test_schemas_without_such_keywords_pass(vocab: Vocab, schema: dict) -> None:
    """只用 xgrammar 保证得了的关键字（注解、$ref、anyOf、枚举……）：两处检查都放行，随机模型的输出通过校验。"""
    spec = json.dumps(schema)
    check_grammar("json_schema", spec)
    jsonschema.validate(json.loads(generate(vocab, vocab.backend.grammar("json_schema", spec), 0, 4.0)), schema)

def test_json_output_never_holds_raw_control_characters(vocab: Vocab) -> None:
    """紧凑的 JSON 里控制字符只可能在字符串里，而 JSON 不许字符串里直接写它们。xgrammar 编限了长度的字符串时放行
    它们（它自己修好时第一个断言失败，那时删掉 json_compiler）；json_schema 的语法在字符串里一个这样的 token 也不放行。"""
    control = torch.tensor([any(c < 0x20 for c in p) for p in vocab.pieces] + [False] * (vocab.size - len(vocab.pieces)))
    (quote,) = vocab.tokenizer.encode('"', add_special_tokens=False)
    plain = xgr.GrammarCompiler(vocab.backend.info, max_threads=1)
    for schema in ({"type": "string", "maxLength": 8}, {"type": "string"}):
        spec = json.dumps(schema)
        theirs, ours = Grammar(plain.compile_json_schema(spec, any_whitespace=False)), vocab.backend.grammar("json_schema", spec)
        assert theirs.accept(quote) and ours.accept(quote)  # 进了字符串
        assert bool(theirs.allowed()[control].any()) == ("maxLength" in schema), "xgrammar keeps them out by itself now"
        assert not ours.allowed()[control].any() and ours.allowed()[~control].any()


def test_is_dead_after_a_branch_that_cannot_finish(vocab: Vocab) -> None:
    """x|ab[^\\s\\S]：能开头（check_grammar 放行），写完 ab 之后一个 token 也不放行——is_dead；走完的语法不算。"""
    check_grammar("regex", "x|ab[^\\s\\S]")
    g = vocab.backend.grammar("regex", "x|ab[^\\s\\S]")
    a, b, x = (vocab.tokenizer.encode(c, add_special_tokens=False)[0] for c in "abx")
    assert not g.is_dead and g.accept(a) and not g.is_dead and g.accept(b) and g.is_dead
    done = vocab.backend.grammar("regex", "x|ab[^\\s\\S]")
    assert done.accept(x) and done.accept(vocab.backend.stop_token_ids[0]) and not done.is_dead

def test_fill_vocab_mask_rows(vocab: Vocab) -> None:
    """批里的每一行：没有语法的、语法已走完的全是 1；受约束的行只允许语法给的；全都不受约束时返回 False。"""
    g, done = vocab.backend.grammar("regex", "[0-9]+"), vocab.backend.grammar("regex", "7")
    assert done.accept(vocab.tokenizer.encode("7", add_special_tokens=False)[0])
    assert done.accept(vocab.backend.stop_token_ids[0]) and done.is_terminated
    mask = torch.zeros(3, (vocab.size + 31) // 32, dtype=torch.int32)
    assert fill_vocab_mask([None, g, done], mask)
    rows = unpack_vocab_mask(mask, vocab.size)
    assert rows[0].all() and rows[2].all()
    assert 0 < rows[1].sum() < vocab.size // 10
    assert not fill_vocab_mask([None, done], mask[:2]) and unpack_vocab_mask(mask[:2], vocab.size).all()


def test_fill_vocab_mask_in_threads_equals_row_by_row(vocab: Vocab) -> None:
    """BatchGrammarMatcher 的几个线程填出的掩码与逐行填的逐位相同（各行停在不同的位置，夹着不受约束的行）。"""
    schema = json.dumps({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                         "required": ["name", "age"]})
    prefixes = ['{"name": "A', '{"name": "Bo", "age": 4', '{"', "", '{"name": "x", "age": 12}']
    grammars: List[Grammar | None] = []
    for p in prefixes * 13:  # 65 行受约束：够 BATCH_FILL_MIN_ROWS，走线程
        g = vocab.backend.grammar("json_schema", schema)
        for t in vocab.tokenizer.encode(p, add_special_tokens=False):
            assert g.accept(t)
        grammars += [g, None]
    W = (vocab.size + 31) // 32
    one, many = torch.zeros(len(grammars), W, dtype=torch.int32), torch.zeros(len(grammars), W, dtype=torch.int32)
    assert fill_vocab_mask(grammars, one) and fill_vocab_mask(grammars, many, vocab.backend.batch)
    assert torch.equal(one, many)
    assert len({tuple(r) for r in unpack_vocab_mask(one[0:10:2], vocab.size).tolist()}) == len(prefixes)
    assert unpack_vocab_mask(one[1::2], vocab.size).all()

@pytest.mark.gpu
def test_apply_vocab_mask_on_cuda() -> None:
    """GPU：同样的掩码在 CUDA 上（我们的 torch 实现、xgrammar 的 kernel）和 CPU 上结果相同。"""
    gen = torch.Generator().manual_seed(1)
    mask = torch.randint(-2**31, 2**31 - 1, (8, 4748), dtype=torch.int32, generator=gen)
    logits = torch.randn(8, 151936, generator=gen)
    cpu = logits.clone()
    apply_vocab_mask(cpu, mask)
    cuda = torch.device("cuda")
    ours, theirs, on_gpu = logits.to(cuda), logits.to(cuda), mask.to(cuda)
    apply_vocab_mask(ours, on_gpu)
    xgr.apply_token_bitmask_inplace(theirs, on_gpu)
    assert torch.equal(ours.cpu(), cpu) and torch.equal(theirs.cpu(), cpu)


# 接进调度器之后：离线的 LLM 和 python -m minisgl，随机的小 Qwen3（真实的分词器）。schema 都有界（字符串限长、整数
# 限范围、数组限个数），所以输出在几十个 token 里结束，finish_reason 必须是 "stop"
bounded_leaves = st.one_of(
    st.integers(0, 8).map(lambda n: {"type": "string", "maxLength": n}),
    st.builds(lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
              st.integers(-50, 50), st.integers(0, 300)),
    st.sampled_from([{"type": "boolean"}, {"type": "null"}]),
    st.lists(scalars, min_size=1, max_size=4, unique_by=json.dumps).map(lambda v: {"enum": v}),
    scalars.map(lambda v: {"const": v}),
)

def bounded_containers(children: st.SearchStrategy) -> st.SearchStrategy:
    arrays = st.builds(lambda items, lo, extra: {"type": "array", "items": items, "minItems": lo,
                                                 "maxItems": lo + extra}, children, st.integers(0, 2), st.integers(0, 2))
    objects = st.dictionaries(names, children, min_size=1, max_size=3).flatmap(
        lambda props: st.lists(st.sampled_from(sorted(props)), unique=True).map(
            lambda required: {"type": "object", "properties": props, "required": required,
                              "additionalProperties": False}))
    return arrays | objects

bounded_schemas = bounded_containers(st.recursive(bounded_leaves, bounded_containers, max_leaves=5))
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]},
                                                    "maxItems": 3}},
          "required": ["name", "age"], "additionalProperties": False}
PHONE = r"1[3-9][0-9]{9}"
SQL = 'root ::= "SELECT " ("name" | "age") " FROM t WHERE id = " [1-9] [0-9]?'
SQL_RE = r"SELECT (name|age) FROM t WHERE id = [1-9][0-9]?"  # 同一个语言的正则

@pytest.fixture(scope="module")
def checker(tiny_qwen3) -> GrammarBackend:
    """和调度器一样的语法（小模型没写 eos：结束符是分词器的 <|im_end|>），用来逐 token 复核输出。"""
    return GrammarBackend(load_tokenizer(tiny_qwen3), 151936, max_threads=1)

def check_output(checker: GrammarBackend, sp: SamplingParams, out: Dict[str, Any]) -> None:
    """输出的 token 逐个喂给一个新的语法状态：每个都被接受（合法的前缀）；stop 时语法恰好走完，文字通过校验。"""
    kind, spec = sp.grammar
    g = checker.grammar(kind, spec)
    assert all(g.accept(t) for t in out["token_ids"]), (spec, out)
    assert g.is_terminated == (out["finish_reason"] == "stop"), (spec, out)
    if out["finish_reason"] == "stop" and kind == "json_schema":
        jsonschema.validate(json.loads(out["text"]), json.loads(spec))
    elif out["finish_reason"] == "stop":
        assert re.fullmatch(spec if kind == "regex" else SQL_RE, out["text"]), (spec, out)

def mixed_requests() -> Tuple[List[str], List[SamplingParams]]:
    """受约束的（四种写法，同一个 schema 三次）和不受约束的请求混在一批里：前五个贪心，后三个带 seed 采样。"""
    person = json.dumps(PERSON)
    params = [SamplingParams(max_tokens=200, json_schema=person),
              SamplingParams(max_tokens=6, json_schema=person),  # 写不完：length，合法的前缀
              SamplingParams(max_tokens=30, regex=PHONE), SamplingParams(max_tokens=30, ebnf=SQL),
              SamplingParams(max_tokens=12, ignore_eos=True),
              SamplingParams(max_tokens=200, json_schema=person, temperature=1.0, seed=7),
              SamplingParams(max_tokens=40, json_schema=JSON_OBJECT_SCHEMA, temperature=0.8, seed=1),
              SamplingParams(max_tokens=12, temperature=1.0, seed=3)]
    prompts = ["Give me a JSON object:", "The weather is", "Call me at", "SQL:", "Once upon", "你好", "1, 2, 3,",
               "北京"]
    return prompts, params

def test_offline_overlap_on_and_off_identical(tiny_qwen3, checker: GrammarBackend) -> None:
    """离线的 LLM，受约束和不受约束的请求混在一批：贪心的请求重叠开和关逐 token 相同，不受约束的那个和它单独成批时
    也相同（掩码只盖自己那一行）；受约束的输出逐 token 合乎语法，stop 的通过校验；同一个 spec 只编译一次；
    槽、页、语法状态全回来。（随机模型的分布几乎是平的：带 seed 的采样对批的组成带来的 1e-6 级的 logits 差异也敏感，
    所以只比较贪心的。）"""
    prompts, params = mixed_requests()
    runs = []
    for overlap in (True, False):
        llm = LLM(tiny_qwen3, device="cpu", num_pages=2048, max_seq_len_override=512, enable_overlap=overlap)
        try:
            outs = llm.generate(prompts, params, use_tqdm=False)
            alone = llm.generate(prompts[4], params[4], use_tqdm=False)[0]
            assert alone["token_ids"] == outs[4]["token_ids"]
            assert (llm.grammar_backend.misses, llm.grammar_backend.hits) == (4, 2)  # 四个 spec，PERSON 用了三次
            assert not llm.grammars and not llm.running and llm.table.num_free == llm.config.max_running_req
            llm.cache.check_integrity()
        finally:
            llm.shutdown()
        runs.append([(o["token_ids"], o["finish_reason"]) for o in outs[:5]])
        for sp, out in zip(params, outs):
            if sp.grammar is not None:
                check_output(checker, sp, out)
        assert [o["finish_reason"] for o in outs] == ["stop", "length", "stop", "stop", "length", "stop", "stop",
                                                      "length"]
    assert runs[0] == runs[1]

@pytest.mark.parametrize("overlap", [True, False])
def test_retraction_resumes_the_same_grammar(tiny_qwen3, checker: GrammarBackend, monkeypatch, overlap: bool) -> None:
    """很小的 KV 池、最乐观的接纳：受约束的请求生成到一半被撤回，恢复后接着同一个语法状态走——输出和它单独运行时
    逐 token 相同、合乎 schema（token 没有被语法吃两次，也没有漏吃）；页和语法状态全部回来。"""
    import minisgl.scheduler.prefill as prefill

    monkeypatch.setattr(prefill, "INIT_TOKEN_RATIO", 0.0)
    monkeypatch.setattr(prefill, "MIN_TOKEN_RATIO", 0.0)
    llm = LLM(tiny_qwen3, device="cpu", num_pages=64, max_seq_len_override=64, max_running_req=6,
              enable_overlap=overlap)
    retracted: List[int] = []  # 被撤回时已经生成了多少个 token
    original = llm._retract

    def spy(req) -> None:
        retracted.append(len(req.input_ids) - (req.max_device_len - req.output_len))
        original(req)

    llm._retract = spy
    try:
        rng = random.Random(0)
        schemas = [{"type": "object", "properties": {k: {"type": "string", "minLength": 4, "maxLength": 8}
                                                     for k in ("ab", "xy")}, "required": ["ab", "xy"],
                    "additionalProperties": False},
                   {"type": "array", "items": {"type": "integer", "minimum": 100, "maximum": 999},
                    "minItems": 3, "maxItems": 4}]
        prompts = [[rng.randrange(100, 5000) for _ in range(rng.randint(3, 8))] for _ in range(6)]
        params = [SamplingParams(max_tokens=48, json_schema=json.dumps(schemas[i % 2])) for i in range(6)]
        alone = [llm.generate([p], [sp], use_tqdm=False)[0] for p, sp in zip(prompts, params)]
        assert not retracted, "one request alone always fits"
        outs = llm.generate(prompts, params, use_tqdm=False)
        assert any(n > 0 for n in retracted), f"no request was retracted mid-generation: {retracted}"
        for sp, out, ref in zip(params, outs, alone):
            assert (out["token_ids"], out["finish_reason"]) == (ref["token_ids"], ref["finish_reason"])
            assert out["finish_reason"] == "stop"
            check_output(checker, sp, out)
        assert not llm.grammars and llm.table.num_free == 6
        llm.cache.check_integrity()
    finally:
        llm.shutdown()

def test_bad_spec_aborts_only_its_request(tiny_qwen3) -> None:
    """没经过 API 检查的坏 spec（离线的 LLM）：编译失败，这个请求以 abort 结束、不生成 token；别的请求照常，资源全回来。
    SamplingParams 自己只查形状：至多一个、非空；它过 msgpack 不走样。"""
    llm = LLM(tiny_qwen3, device="cpu", num_pages=512, max_seq_len_override=128)
    try:
        bad, good = SamplingParams(max_tokens=8, regex="(("), SamplingParams(max_tokens=8, regex="[a-c]+")
        outs = llm.generate(["x", "y"], [bad, good], use_tqdm=False)
        assert (outs[0]["finish_reason"], outs[0]["token_ids"]) == ("abort", [])
        assert re.fullmatch("[a-c]+", outs[1]["text"]) and outs[1]["finish_reason"] == "length"
        alone = llm.generate("x", bad, use_tqdm=False)  # 一批里只有它：被拒绝的这一步，调度器也没有别的事可做
        assert (alone[0]["finish_reason"], alone[0]["token_ids"]) == ("abort", [])
        assert not llm.grammars and llm.table.num_free == llm.config.max_running_req
        llm.cache.check_integrity()
    finally:
        llm.shutdown()
    with pytest.raises(ValueError, match=r"^ebnf='root ::= \"a\"' cannot be combined with regex"):
        SamplingParams(regex="a", ebnf='root ::= "a"')
    with pytest.raises(ValueError, match=r"^json_schema='' must be a non-empty string"):
        SamplingParams(json_schema="")
    sp = SamplingParams(json_schema=json.dumps(PERSON), max_tokens=3)
    assert decode(encode(sp)) == sp and decode(encode(sp)).grammar == ("json_schema", json.dumps(PERSON))

def test_dead_end_ends_with_length_and_a_warning(tiny_qwen3, monkeypatch) -> None:
    """正则 ab[^\\s\\S] 能开头、永远写不完：写完 ab 之后掩码全是 0。请求以 length 结束（输出是语法接受过的前缀 ab，
    最后带一个不显示的结束符），日志里是一条警告、不是错误；同一批里的别的请求照常。连第一个 token 都不放行的
    [^\\s\\S]：编译时就拒绝，以 abort 结束、不生成 token。重叠开、关都一样。"""
    import minisgl.scheduler.scheduler as scheduler

    logged: Dict[str, List[str]] = {"warning": [], "error": []}
    for level in logged:
        monkeypatch.setattr(scheduler.logger, level, lambda msg, _l=level: logged[_l].append(msg))
    params = [SamplingParams(max_tokens=10, regex="ab[^\\s\\S]"), SamplingParams(max_tokens=8, regex="[a-c]+"),
              SamplingParams(max_tokens=10, regex="[^\\s\\S]")]
    for overlap in (True, False):
        llm = LLM(tiny_qwen3, device="cpu", num_pages=512, max_seq_len_override=128, enable_overlap=overlap)
        try:
            dead, good, never = llm.generate(["x", "y", "z"], params, use_tqdm=False)
            assert (dead["text"], dead["finish_reason"]) == ("ab", "length"), dead
            assert dead["token_ids"][-1] in llm.grammar_backend.stop_token_ids
            assert re.fullmatch("[a-c]+", good["text"]) and good["finish_reason"] == "length"
            assert (never["finish_reason"], never["token_ids"]) == ("abort", [])
            assert not llm.grammars and llm.table.num_free == llm.config.max_running_req
            llm.cache.check_integrity()
        finally:
            llm.shutdown()
    assert not logged["error"], logged
    assert sum("allows no next token" in m for m in logged["warning"]) == 2, logged
    assert sum("no output can satisfy it" in m for m in logged["warning"]) == 2, logged

class Gate:
    """让编译停在半路：entered 表示编译已经开始，open 之前它不往下走。"""

    def __init__(self) -> None:
        self.entered, self.open = threading.Event(), threading.Event()

def test_slow_compile_does_not_stall_other_requests(tiny_qwen3, checker: GrammarBackend, monkeypatch) -> None:
    """语法在编译线程里编译：一个编译得很慢的 schema（这里让它一直等到别的请求开始最后一步）不耽误别的请求——它们
    一步步照常走完，它编译好了才进等待队列，输出照常合乎 schema。编译中途中止：立刻 abort，不占槽和页，编译照样做完、
    进缓存。关掉调度器：排队的编译取消，正在做的做完。"""
    gates: Dict[str, Gate] = {}
    compile_ = GrammarBackend.compile

    def gated(self, kind: str, spec: str):
        if spec in gates:
            gates[spec].entered.set()
            assert gates[spec].open.wait(20), "the compile waited for steps that never came"
        return compile_(self, kind, spec)

    monkeypatch.setattr(GrammarBackend, "compile", gated)
    llm = LLM(tiny_qwen3, device="cpu", num_pages=512, max_seq_len_override=256)
    steps: List[List[int]] = []
    launch = llm.launch
    slow = json.dumps(PERSON)
    gates[slow] = Gate()

    def spy(batch, last=None):
        steps.append([r.uid for r in batch.reqs])
        if sum(1 in s for s in steps) == 12:  # 不受约束的请求（uid 1，12 个 token）的最后一步：放行编译
            gates[slow].open.set()
        return launch(batch, last)

    llm.launch = spy
    try:
        params = [SamplingParams(max_tokens=200, json_schema=slow), SamplingParams(max_tokens=12, ignore_eos=True)]
        constrained, free = llm.generate(["Person:", "free"], params, use_tqdm=False)
        first = min(i for i, s in enumerate(steps) if 0 in s)
        assert steps[0] == [1] and all(1 not in s for s in steps[first:]), steps  # 编译期间 uid 1 走完了 12 步
        assert free["finish_reason"] == "length" and len(free["token_ids"]) == 12
        assert constrained["finish_reason"] == "stop"
        check_output(checker, params[0], constrained)

        other = json.dumps({"type": "array", "items": {"type": "integer"}, "maxItems": 2})
        gates[other] = Gate()
        llm._outputs[100] = []
        llm.receive_msg(UserMsg(100, torch.tensor([1, 2, 3], dtype=torch.int32),
                                SamplingParams(max_tokens=8, json_schema=other)))
        assert gates[other].entered.wait(20)
        assert llm.has_work and not llm.prefill.pending and llm.table.num_free == llm.config.max_running_req
        assert (llm.stats().waiting, llm.stats().running) == (1, 0)  # /metrics 里它在排队
        llm.abort_request(100)
        assert llm._done.pop(100) == "abort" and llm._outputs.pop(100) == [] and not llm.has_work
        gates[other].open.set()
        llm._compile_pool.submit(lambda: None).result(timeout=30)  # 编译线程把手上的做完
        assert llm.grammar_backend.cached("json_schema", other) is not None and not llm.grammars

        blocked, queued = (json.dumps({"enum": [i]}) for i in (1, 2))
        gates[blocked] = Gate()
        for uid, spec in [(101, blocked), (102, queued)]:
            llm.receive_msg(UserMsg(uid, torch.tensor([1, 2], dtype=torch.int32), SamplingParams(json_schema=spec)))
        assert gates[blocked].entered.wait(20)
        futures = [future for _, future in llm._compiling.values()]
        llm.shutdown()
        assert futures[1].cancelled() and not llm._compiling and not llm.has_work
        gates[blocked].open.set()
        futures[0].result(timeout=30)  # 正在编译的那一个做完，编译线程随后退出
    finally:
        for gate in gates.values():
            gate.open.set()
        llm.shutdown()

def _slow_rank1_main(config, ack) -> None:
    """TP=2 的调度器进程（spawn 按名字导入本模块）：rank 1 每个 spec 多编译 0.5 秒，两个 rank 在不同的步里编译好。"""
    import test_ch14_multiprocess as ch14

    if config.tp_info.rank == 1:
        compile_ = GrammarBackend.compile

        def slow(self, kind: str, spec: str):
            time.sleep(0.5)
            return compile_(self, kind, spec)

        GrammarBackend.compile = slow
    ch14._rank_main(config, ack)

def test_tp2_ranks_admit_a_grammar_in_the_same_step(tiny_qwen3, checker: GrammarBackend, monkeypatch) -> None:
    """TP=2 的两个调度器进程，rank 1 编译得慢：每一步只放行两个 rank 都编译好了的请求，两边的批一样——受约束和不受约束
    的请求都与离线的 TP=1 逐 token 相同，两个 rank 收到的消息相同。"""
    import test_ch14_multiprocess as ch14

    person, pair = json.dumps(PERSON), json.dumps({"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 3})
    prompts = [[100 + i, 7, 8, 9] for i in range(5)]
    params = [SamplingParams(max_tokens=16, ignore_eos=True), SamplingParams(max_tokens=200, json_schema=person),
              SamplingParams(max_tokens=30, regex=PHONE), SamplingParams(max_tokens=200, json_schema=person),
              SamplingParams(max_tokens=100, json_schema=pair)]
    llm = LLM(tiny_qwen3, **ch14.SMALL)
    try:
        outs = llm.generate(prompts, params, use_tqdm=False)
    finally:
        llm.shutdown()
    for sp, out in zip(params[1:], outs[1:]):
        check_output(checker, sp, out)
    monkeypatch.setattr(ch14, "_rank_main", _slow_rank1_main)  # Harness 用它作 spawn 的入口
    h = ch14.Harness(tiny_qwen3, 2)
    try:
        assert h.ack.get(timeout=120) == "Scheduler is ready"
        for uid in range(5):
            if uid == 4:
                h.collect()  # 已经有请求在生成：最后一个在它们运行中途到达
            h.tokens[uid] = []
            h.send.put(UserMsg(uid, torch.tensor(prompts[uid], dtype=torch.int32), params[uid]))
        h.wait(range(5))
        assert [(h.tokens[u], h.done[u]) for u in range(5)] == [(o["token_ids"], o["finish_reason"]) for o in outs]
        reports = h.exit()
        assert [r[0] for r in reports] == [0, 1] and reports[0][1:] == reports[1][1:], reports
    finally:
        h.close()


@pytest.fixture(scope="module")
def server(tiny_qwen3, tmp_path_factory) -> Iterator[Tuple[int, Path]]:
    """python -m minisgl 跑随机的小 Qwen3，重叠调度（默认）开着；第 15 章测试里的启动和停止。"""
    log = tmp_path_factory.mktemp("structured") / "server.log"
    proc, port = start_server(tiny_qwen3, log, "--max-seq-len-override", "512")
    yield port, log
    stop_server(proc)

# Qwen3 的模板会思考：受约束的请求默认先让模型想（语法等 </think> 之后再管），随机模型却写不出 </think>，一想就停不下
# 来。测语法本身的请求像用户那样关掉思考（提示词里一段空的思考），语法从第一个 token 管起
DIRECT = {"chat_template_kwargs": {"enable_thinking": False}}

def schema_format(schema: dict) -> Dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}

@settings(max_examples=4, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(batch=st.lists(bounded_schemas, min_size=6, max_size=6), seed=st.integers(0, 2**31))
def test_server_random_schemas(server, batch: List[dict], seed: int) -> None:
    """官方客户端同时发出六个随机 schema 的对话请求（一半贪心，一半带 seed 采样、n=2）和两个不受约束的补全，混在
    几批里：每个受约束的回答都以 stop 结束，解析出来通过它的 schema 的校验。"""
    port, _ = server
    c = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=120)

    async def constrained(i: int, schema: dict) -> Tuple[dict | None, Any]:
        return schema, await c.chat.completions.create(
            model="m", messages=[{"role": "user", "content": f"Answer {i} in JSON."}], max_tokens=400,
            n=1 if i % 2 == 0 else 2, temperature=0 if i % 2 == 0 else 1.0, seed=seed + i,
            response_format=schema_format(schema), extra_body=DIRECT)

    async def free(i: int) -> Tuple[dict | None, Any]:
        return None, await c.completions.create(model="m", prompt=f"free {i}", max_tokens=20, temperature=1.0,
                                                extra_body={"ignore_eos": True})

    async def main() -> List[Tuple[dict | None, Any]]:
        try:
            return await asyncio.gather(*[constrained(i, s) for i, s in enumerate(batch)], free(0), free(1))
        finally:
            await c.close()

    for schema, r in asyncio.run(main()):
        for choice in r.choices:
            if schema is None:
                assert choice.finish_reason == "length"
                continue
            assert choice.finish_reason == "stop", (schema, choice.message.content)
            jsonschema.validate(json.loads(choice.message.content), schema)

def test_api_checks_grammars_off_the_event_loop(monkeypatch) -> None:
    """API Server 查 spec 时不占着事件循环：查在线程池里跑，查的那段时间里别的协程照常在转；坏 spec 仍是 400，
    param 是请求里的名字。"""
    from minisgl.server import api_server

    on_loop_thread = []

    def slow_check(kind: str, spec: str) -> None:  # 代替 check_grammar：一个要编译 0.2 秒的 spec
        on_loop_thread.append(threading.current_thread() is threading.main_thread())
        time.sleep(0.2)
        if spec == "b+[":
            raise ValueError(f"{kind}={spec}: unterminated character set")

    monkeypatch.setattr(api_server, "check_grammar", slow_check)
    api_server._check_grammar.cache_clear()

    async def main() -> Tuple[int, Any]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.create_task(ticker())
        await api_server._check_request_grammar(SamplingParams(regex="a+"))
        with pytest.raises(api_server.APIError) as bad:
            await api_server._check_request_grammar(SamplingParams(regex="b+["))
        task.cancel()
        return ticks, bad.value

    try:
        ticks, err = asyncio.run(main())
    finally:
        api_server._check_grammar.cache_clear()  # 别把替身的结果留给后面的测试
    assert on_loop_thread == [False, False]
    assert ticks >= 10, ticks  # 0.4 秒的检查里，每 10 ms 一次的协程转了至少 10 次
    assert err.status == 400 and err.param == "regex" and "unterminated" in err.message

def test_server_formats_streams_and_400s(server, tiny_qwen3, checker: GrammarBackend) -> None:
    """json_object（对话和补全）、SGLang 的 regex / ebnf；服务的贪心输出和离线 LLM 的逐字相同，流式拼起来和非流式
    相同；length 截断的是合法的前缀。坏的 schema / 正则 / 文法、写法不对的 response_format 都是 400，指明参数，
    调度器一个也没见到；最后所有请求槽和 KV 页都回来。"""
    port, log = server
    c = client(port)
    chat = [{"role": "user", "content": "Give me a JSON object."}]
    r = c.chat.completions.create(model="m", messages=chat, max_tokens=60, temperature=0.7, seed=5,
                                  response_format={"type": "json_object"}, extra_body=DIRECT)
    outputs = [(ch.message.content, ch.finish_reason) for ch in r.choices]
    r = c.completions.create(model="m", prompt="JSON:", max_tokens=60, temperature=0.7, seed=5, n=3,
                             extra_body={"response_format": {"type": "json_object"}})
    outputs += [(ch.text, ch.finish_reason) for ch in r.choices]
    for text, reason in outputs:  # 写完的是一个对象；没写完的（length）也是合法的前缀
        assert checker.grammar("json_schema", JSON_OBJECT_SCHEMA).matcher.accept_string(text), text
        assert reason == "length" or isinstance(json.loads(text), dict), text
    llm = LLM(tiny_qwen3, device="cpu", num_pages=1024, max_seq_len_override=512)
    try:
        for prompt, sp, extra in [("Call me at", SamplingParams(max_tokens=30, regex=PHONE), {"regex": PHONE}),
                                  ("SQL:", SamplingParams(max_tokens=30, ebnf=SQL), {"ebnf": SQL}),
                                  ("Person:", SamplingParams(max_tokens=200, json_schema=json.dumps(PERSON)),
                                   {"response_format": schema_format(PERSON)})]:
            r = c.completions.create(model="m", prompt=prompt, max_tokens=sp.max_tokens, temperature=0,
                                     extra_body=extra).choices[0]
            offline = llm.generate(prompt, sp, use_tqdm=False)[0]
            assert (r.text, r.finish_reason) == (offline["text"], offline["finish_reason"]) and r.finish_reason == "stop"
            check_output(checker, sp, offline)
    finally:
        llm.shutdown()
    whole = c.chat.completions.create(model="m", messages=chat, max_tokens=200, temperature=0,
                                      response_format=schema_format(PERSON), extra_body=DIRECT).choices[0]
    chunks = list(c.chat.completions.create(model="m", messages=chat, max_tokens=200, temperature=0, stream=True,
                                            response_format=schema_format(PERSON), extra_body=DIRECT))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == whole.message.content
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason == "stop"
    jsonschema.validate(json.loads(whole.message.content), PERSON)
    cut = c.chat.completions.create(model="m", messages=chat, max_tokens=4, temperature=0,
                                    response_format=schema_format(PERSON), extra_body=DIRECT).choices[0]
    assert cut.finish_reason == "length" and cut.message.content == whole.message.content[:len(cut.message.content)]
    assert checker.grammar("json_schema", json.dumps(PERSON)).matcher.accept_string(cut.message.content)

    bad = [({"response_format": schema_format({"type": "objec"})}, "response_format", 'Unsupported type "objec"'),
           ({"response_format": {"type": "json_schema"}}, "response_format", 'needs "json_schema"'),
           ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format",
            "response_format.json_schema.schema: Field required"),
           ({"response_format": {"type": "xml"}}, "response_format", "response_format.type"),
           ({"response_format": {"type": "json_schema", "json_schema": {"name": "a b!", "schema": {"type": "object"}}}},
            "response_format", "response_format.json_schema.name: String should match pattern"),
           ({"response_format": schema_format({"type": "array", "uniqueItems": True})}, "response_format",
            "': uniqueItems at # is not supported: the output could repeat items"),
           ({"response_format": schema_format({"oneOf": [{"type": "integer"}, {"type": "number"}]})}, "response_format",
            "oneOf at # is not supported: exactly one matching branch cannot be enforced; use anyOf"),
           ({"response_format": schema_format({"type": "object", "properties": {}, "required": ["age"]})},
            "response_format", "required at # lists 'age', which is not under properties"),
           ({"response_format": schema_format({"anyOf": []})}, "response_format", "anyOf at # has no branches"),
           ({"regex": "[^\\s\\S]"}, "regex", "regex='[^\\\\s\\\\S]': no output can satisfy it"),
           ({"regex": "(("}, "regex", "regex='((': Regex parsing error"),
           ({"regex": ""}, "regex", "regex='' must be a non-empty string"),
           ({"ebnf": "root ::= foo"}, "ebnf", 'Rule "foo" is not defined'),
           ({"response_format": {"type": "json_object"}, "regex": "a"}, "regex", "cannot be combined")]
    for body, param, message in bad:
        for create, kwargs in [(c.chat.completions.create, {"messages": chat}),
                               (c.completions.create, {"prompt": "x"})]:
            with pytest.raises(BadRequestError) as e:
                create(model="m", max_tokens=8, extra_body=body, **kwargs)
            assert e.value.status_code == 400 and e.value.body["param"] == param, e.value.body
            assert message in e.value.body["message"], e.value.body
    for create, kwargs, extra in [(c.chat.completions.create, {"messages": chat}, DIRECT),  # 能开头、写完 ab 就无路可走
                                  (c.completions.create, {"prompt": "x"}, {})]:
        r = create(model="m", max_tokens=8, temperature=0, extra_body={"regex": "ab[^\\s\\S]", **extra},
                   **kwargs).choices[0]
        assert (getattr(r, "text", None) or r.message.content, r.finish_reason) == ("ab", "length")
    t0 = time.monotonic()
    while (m := metrics(port))["minisgl_num_running_requests"] or m["minisgl_kv_pages_used"]:
        assert time.monotonic() - t0 < 5, m
        time.sleep(0.05)
    text = log.read_text()
    assert "refused" not in text and "outside its grammar" not in text
    assert text.count("allows no next token") == 2


def test_generate_keeps_chapter_15s_guards(server, monkeypatch) -> None:
    """附录重写了 _generate，第 15 章的两处照样在：补全接口没给 max_tokens 时，放不下的 400 说出 16 从哪来；
    发到一半失败时，发出去的请求中止，没发出的登记忘掉。"""
    port, _ = server
    with pytest.raises(BadRequestError) as e:  # 服务的上下文 512：500 个 token 的提示词只剩 12 个位置
        client(port).completions.create(model="m", prompt=[7] * 500)
    assert e.value.body["param"] == "max_tokens" and e.value.body["message"].startswith(
        "max_tokens=16 (the completions API's default: the request gives none) is too large: the prompt has 500 "
        "tokens and the context is 512, so at most 12 tokens can be generated"), e.value.body
    from minisgl.server import api_server

    class State:  # _generate 在发完之前用到的几样：登记、发送（第三个失败）、忘掉、中止
        def __init__(self) -> None:
            self.registered, self.sent, self.aborted = set(), [], []

        def new_users(self, k: int) -> List[int]:
            self.registered |= set(range(10, 10 + k))
            return list(range(10, 10 + k))

        async def send_one(self, msg: Any) -> None:
            if len(self.sent) == 2:
                raise ConnectionError("the tokenizer is gone")
            self.sent.append(msg.uid)

        def _forget(self, uid: int) -> None:
            self.registered.discard(uid)

        async def abort_users(self, uids: List[int]) -> None:
            self.aborted += uids

    state = State()
    monkeypatch.setattr(api_server, "get_state", lambda: state)

    async def go() -> None:
        req = api_server.CompletionRequest(model="m", prompt="hi", n=4, seed=3)
        with pytest.raises(ConnectionError):
            await api_server._generate(req, None, ["hi"], SamplingParams(seed=3), chat=False)
        await asyncio.sleep(0)  # 中止是另起的任务

    asyncio.run(go())
    assert (state.sent, state.aborted, state.registered) == ([10, 11], [10, 11], {10, 11})


def test_server_continue_final_message(server, tiny_qwen3) -> None:
    """continue_final_message：回答接着最后一条 assistant 消息的文字往下写。提示词是模板为这段对话、不加生成提示
    渲染出来的：贪心的回答和把这段文字当纯提示词发给补全接口的逐字相同，回答里没有那段开头，也不切思考。最后一条
    不是 assistant 消息、它没有文字、和语法一起给，都是 400。"""
    port, _ = server
    c = client(port)
    tok = load_tokenizer(tiny_qwen3)
    chat = [{"role": "user", "content": "Give me JSON."}, {"role": "assistant", "content": '{"name": "'}]
    rendered = tok.apply_chat_template(chat, tokenize=False, continue_final_message=True)
    assert rendered.endswith('<|im_start|>assistant\n<think>\n\n</think>\n\n{"name": "')
    c.completions.create(model="m", prompt=rendered, max_tokens=1)  # 先进缓存：两个请求之后一样地命中
    r = c.chat.completions.create(model="m", messages=chat, max_tokens=8, temperature=0,
                                  extra_body={"continue_final_message": True})
    plain = c.completions.create(model="m", prompt=rendered, max_tokens=8, temperature=0)
    assert r.choices[0].message.content == plain.choices[0].text and r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == plain.usage.prompt_tokens == len(tok.encode(rendered, add_special_tokens=False))
    assert "reasoning_content" not in r.choices[0].message.model_dump(exclude_unset=True)
    for messages, extra, message in [(chat[:1], {}, "needs the last message to be an assistant message"),
                                     (chat[:1] + [{"role": "assistant", "content": " "}], {}, "with text to continue"),
                                     (chat, {"response_format": {"type": "json_object"}}, "cannot be combined")]:
        with pytest.raises(BadRequestError) as e:
            c.chat.completions.create(model="m", messages=messages, max_tokens=4,
                                      extra_body={"continue_final_message": True, **extra})
        assert e.value.body["param"] == "continue_final_message" and message in e.value.body["message"], e.value.body


def test_server_reasoning_effort(server) -> None:
    """思考力度 none 关掉思考：对话接口的 reasoning_effort 和 Responses 的 reasoning.effort，提示词和回答都和
    chat_template_kwargs 里 enable_thinking: false 的请求一样，没有思考；medium 和不给一样。别的力度、和
    enable_thinking: true 一起给、纯提示词、Responses 的 summary 都是指明参数的 400。"""
    port, _ = server
    c = client(port)
    ask = dict(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=6, temperature=0)
    off = c.chat.completions.create(**ask, extra_body=DIRECT)
    none = c.chat.completions.create(**ask, reasoning_effort="none")
    assert (none.choices[0].message.content, none.usage.prompt_tokens) == \
        (off.choices[0].message.content, off.usage.prompt_tokens)
    assert getattr(none.choices[0].message, "reasoning_content", None) is None
    default = c.chat.completions.create(**ask)
    medium = c.chat.completions.create(**ask, reasoning_effort="medium")
    assert medium.usage.prompt_tokens == default.usage.prompt_tokens == off.usage.prompt_tokens - 4  # 少一段空的思考
    assert medium.choices[0].message == default.choices[0].message
    for extra in [{"reasoning_effort": "high"},
                  {"reasoning_effort": "none", "chat_template_kwargs": {"enable_thinking": True}}]:
        with pytest.raises(BadRequestError) as e:
            c.chat.completions.create(**ask, extra_body=extra)
        assert e.value.body["param"] == "reasoning_effort", e.value.body
    with pytest.raises(BadRequestError) as e:
        c.chat.completions.create(model="m", messages=None, max_tokens=2,
                                  extra_body={"prompt": "Hi", "reasoning_effort": "none"})
    assert e.value.body["param"] == "reasoning_effort" and "plain 'prompt'" in e.value.body["message"]

    r_off = c.responses.create(model="m", input="Hi", max_output_tokens=6, temperature=0, extra_body=DIRECT)
    r_none = c.responses.create(model="m", input="Hi", max_output_tokens=6, temperature=0,
                                reasoning={"effort": "none"})
    assert [o.type for o in r_none.output] == [o.type for o in r_off.output] == ["message"]
    assert (r_none.output_text, r_none.usage.input_tokens) == (r_off.output_text, r_off.usage.input_tokens)
    for reasoning in [{"effort": "low"}, {"summary": "auto"}]:
        with pytest.raises(BadRequestError) as e:
            c.responses.create(model="m", input="Hi", max_output_tokens=2, reasoning=reasoning)
        assert e.value.body["param"] == "reasoning", e.value.body


def test_server_responses_logprobs(server) -> None:
    """Responses API 的 include message.output_text.logprobs：message 项的文字带上每个 token 的对数概率，和对话接口
    同一个贪心请求的逐项相同；top_logprobs 截到要的个数；流式 delta 事件里的接起来等于非流式的（事件里没有 bytes）；
    没要时是空的；top_logprobs 不带 include、超出 0..20 都是 400。"""
    port, _ = server
    c = client(port)
    ask = [{"role": "user", "content": "Say something."}]
    c.chat.completions.create(model="m", messages=ask, max_tokens=1, extra_body=DIRECT)  # 先进缓存：之后一样地命中
    chat = c.chat.completions.create(model="m", messages=ask, max_tokens=12, temperature=0, logprobs=True,
                                     top_logprobs=3, extra_body=DIRECT).choices[0]
    kw = dict(model="m", input=ask, max_output_tokens=12, temperature=0, extra_body=DIRECT)
    r = c.responses.create(include=["message.output_text.logprobs"], top_logprobs=3, **kw)
    part = r.output[0].content[0]
    assert part.text == chat.message.content and len(part.logprobs) == 12 and r.top_logprobs == 3
    assert [lp.model_dump() for lp in part.logprobs] == [e.model_dump() for e in chat.logprobs.content]
    assert all(len(lp.top_logprobs) == 3 for lp in part.logprobs)
    events = list(c.responses.create(include=["message.output_text.logprobs"], top_logprobs=3, stream=True, **kw))
    want = [{"token": lp.token, "logprob": lp.logprob,
             "top_logprobs": [{"token": t.token, "logprob": t.logprob} for t in lp.top_logprobs]} for lp in part.logprobs]
    assert [lp.model_dump() for e in events if e.type == "response.output_text.delta" for lp in e.logprobs] == want
    assert [lp.model_dump() for lp in next(e for e in events if e.type == "response.output_text.done").logprobs] == want
    assert events[-1].response.output[0].content == r.output[0].content  # 流式的最后一个响应对象也一样
    none = c.responses.create(include=["message.output_text.logprobs"], **kw).output[0].content[0].logprobs
    assert [(lp.token, lp.top_logprobs) for lp in none] == [(lp.token, []) for lp in part.logprobs]
    assert c.responses.create(**kw).output[0].content[0].logprobs == []
    for body, message in [({"top_logprobs": 2}, "top_logprobs needs include"),
                          ({"top_logprobs": 21, "include": ["message.output_text.logprobs"]}, "top_logprobs=21")]:
        response = httpx.post(f"http://127.0.0.1:{port}/v1/responses", timeout=60,
                              json={"model": "m", "input": "hi", "max_output_tokens": 4, **body})
        error = response.json()["error"]
        assert response.status_code == 400 and error["param"] == "top_logprobs" and message in error["message"], error


WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city now",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "The time now"}}]
PARAMETERS = {"get_weather": WEATHER, "get_time": {"type": "object", "properties": {}, "additionalProperties": False}}
PICK = {"type": "object", "properties": {"a": {"enum": [1, 2, 3]}}, "required": ["a"], "additionalProperties": False}

def cut(parser: ToolCallParser | ReasoningParser, pieces: List[str]) -> Tuple[Any, Any]:
    """一段一段喂给切分器，最后 finish，两样各自拼起来：ToolCallParser 是（内容, 全部调用），ReasoningParser 是
    （思考, 内容）。"""
    outs = [parser.feed(piece) for piece in pieces] + [parser.finish()]
    return tuple(functools.reduce(lambda a, b: a + b, column) for column in zip(*outs))  # type: ignore[return-value]

def test_tool_call_parser_any_split() -> None:
    """内容、两个调用、一个不认识的函数（原样算内容）、一个没写完的调用：在每一个切分点切成两段喂、一个字符一个
    字符地喂，和整段喂一次切出来的一字不差；强制时没写完的数组原样算内容。"""
    weather = {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
    text = (f"Let me check.\n\n<tool_call>\n{json.dumps(weather)}\n</tool_call>\n<tool_call>\n"
            f'{{"name": "fly", "arguments": {{}}}}\n</tool_call>\n<tool_call>\n{{"name": "get_time"}}\n</tool_call>\n'
            f"<tool_call>\n{{\"name\": \"get_ti")
    want = ('Let me check.<tool_call>\n{"name": "fly", "arguments": {}}\n</tool_call><tool_call>\n{"name": "get_ti',
            [{"index": 0, "id": "call_7_0", "name": "get_weather", "arguments": json.dumps(weather["arguments"])},
             {"index": 1, "id": "call_7_1", "name": "get_time", "arguments": "{}"}])
    names = {"get_weather", "get_time"}
    assert cut(ToolCallParser(names, False, "call_7"), [text]) == want
    assert cut(ToolCallParser(names, False, "call_7"), list(text)) == want
    for k in range(len(text) + 1):
        assert cut(ToolCallParser(names, False, "call_7"), [text[:k], text[k:]]) == want, k
    plain = "a <tool> b < tool_call>\n"  # 像标记而不是标记：原样是内容，末尾的空白也在（没有调用）
    assert cut(ToolCallParser(names, False, "c"), list(plain)) == (plain, [])
    forced = json.dumps([weather, {"name": "get_time", "arguments": {}}])
    assert cut(ToolCallParser(names, True, "call_7"), list(forced)) == ("", want[1])
    assert cut(ToolCallParser(names, True, "c"), [forced[:20]]) == (forced[:20], [])

@pytest.mark.parametrize("name, parallel", [(None, True), (None, False), ("get_weather", True)])
def test_forced_tool_calls_are_valid(vocab: Vocab, name: str | None, parallel: bool) -> None:
    """强制调用的 schema（required 任选、只调一个、指定 get_weather）在真实的分词器上、随机 logits 的"模型"下：
    输出总能切成调用，名字是声明过的（指定时就是它），参数通过它自己 parameters 的校验。"""
    schema = json.dumps(forced_schema(TOOLS, name, parallel))
    for seed in range(6):
        text = generate(vocab, vocab.backend.grammar("json_schema", schema), seed, bias=3.0)
        content, calls = cut(ToolCallParser(set(PARAMETERS), True, "call_0"), [text])
        assert content == "" and calls, text
        assert len(calls) == 1 or (name is None and parallel), text
        for call in calls:
            assert name in (None, call["name"]), text
            jsonschema.validate(json.loads(call["arguments"]), PARAMETERS[call["name"]])

def test_server_tool_calls(server, tiny_qwen3, smollm2) -> None:
    """官方客户端发工具调用，服务是随机的小 Qwen3（真实的 Qwen3 对话模板）：
    - auto：用 ebnf 让模型写出一段话和两个 <tool_call>，切出来的内容和调用流式、非流式一样，finish_reason 是 tool_calls；
      parallel_tool_calls=false 时只交出第一个；
    - required（只调一个，n=2 采样）和指定函数（流式和非流式一样，finish_reason 是 stop）：调用的参数通过校验；
    - none：工具不进提示词；多轮对话里的调用和结果按模板写进提示词，token 数和分词器自己套模板的一样；
    - 坏请求都是 400、指明参数；最后所有请求槽和 KV 页都回来。"""
    port, log = server
    c = client(port)
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    weather = {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
    said = (f"Let me check.\n<tool_call>\n{json.dumps(weather)}\n</tool_call>\n<tool_call>\n"
            f'{{"name": "get_time", "arguments": {{}}}}\n</tool_call>')
    auto = dict(model="m", messages=ask, tools=TOOLS, max_tokens=300, temperature=0,
                extra_body={"ebnf": f"root ::= {json.dumps(said)}", **DIRECT})
    whole = c.chat.completions.create(**auto).choices[0]
    calls = [(t.function.name, json.loads(t.function.arguments)) for t in whole.message.tool_calls]
    assert calls == [("get_weather", weather["arguments"]), ("get_time", {})]
    assert (whole.message.content, whole.finish_reason) == ("Let me check.", "tool_calls")
    assert all(re.fullmatch(rf"call_\d+_{k}", t.id) and t.type == "function"
               for k, t in enumerate(whole.message.tool_calls))
    chunks = list(c.chat.completions.create(**auto, stream=True))
    streamed = [t for ch in chunks for t in ch.choices[0].delta.tool_calls or []]
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == "Let me check."
    assert [(t.index, t.function.name, json.loads(t.function.arguments)) for t in streamed] == \
        [(k, *call) for k, call in enumerate(calls)]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    for stream in (False, True):  # parallel_tool_calls=false：模型自己写了两个，只交出第一个
        answer = c.chat.completions.create(**auto, parallel_tool_calls=False, stream=stream)
        one = [t for ch in answer for t in ch.choices[0].delta.tool_calls or []] if stream else \
            answer.choices[0].message.tool_calls
        assert [(t.function.name, json.loads(t.function.arguments)) for t in one] == calls[:1]

    r = c.chat.completions.create(model="m", messages=ask, tools=TOOLS, tool_choice="required",
                                  parallel_tool_calls=False, n=2, temperature=1.0, seed=3, max_tokens=200,
                                  extra_body=DIRECT)
    for choice in r.choices:
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        (call,) = choice.message.tool_calls
        jsonschema.validate(json.loads(call.function.arguments), PARAMETERS[call.function.name])
    named = dict(model="m", messages=ask, tools=TOOLS, temperature=0, max_tokens=200, extra_body=DIRECT,
                 tool_choice={"type": "function", "function": {"name": "get_weather"}})
    whole = c.chat.completions.create(**named).choices[0]
    assert whole.finish_reason == "stop" and [t.function.name for t in whole.message.tool_calls] == ["get_weather"]
    jsonschema.validate(json.loads(whole.message.tool_calls[0].function.arguments), WEATHER)
    chunks = list(c.chat.completions.create(**named, stream=True))
    streamed = [t for ch in chunks for t in ch.choices[0].delta.tool_calls or []]
    assert [(t.function.name, t.function.arguments) for t in streamed] == \
        [(t.function.name, t.function.arguments) for t in whole.message.tool_calls]
    assert not any(ch.choices[0].delta.content for ch in chunks) and chunks[-1].choices[0].finish_reason == "stop"

    def prompt_tokens(messages: List[Dict[str, Any]], **kwargs: Any) -> int:
        return c.chat.completions.create(model="m", messages=messages, max_tokens=2, temperature=0,
                                         **kwargs).usage.prompt_tokens

    tokenizer = load_tokenizer(tiny_qwen3)
    assert prompt_tokens(ask, tools=TOOLS, tool_choice="none") == prompt_tokens(ask)
    turn = ask + [{"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function", "function": {
        "name": "get_weather", "arguments": json.dumps(weather["arguments"])}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny"}]
    rendered = ask + [{"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
                                                                           "function": weather}]},
                      {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny"}]
    want = len(tokenizer.apply_chat_template(rendered, tools=TOOLS, add_generation_prompt=True, tokenize=True,
                                             return_dict=True)["input_ids"])
    assert prompt_tokens(turn, tools=TOOLS) == want > prompt_tokens(ask, tools=TOOLS) > prompt_tokens(ask)

    unique = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"xs": {"type": "array", "uniqueItems": True}}}}}
    bad_args = {"id": "c", "type": "function", "function": {"name": "get_time", "arguments": "{oops"}}
    assert prompt_tokens(ask, tools=[], tool_choice="auto") == prompt_tokens(ask)  # 没有工具：auto 等于 none
    bad = [({"tool_choice": "required"}, "tool_choice", "a forced tool_choice needs a non-empty tools list"),
           ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "fly"}}}, "tool_choice",
            "'fly', which is not in tools"),
           ({"tools": TOOLS + TOOLS[:1]}, "tools", "two tools have the same function name"),
           ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice",
            "tool_choice cannot be combined with response_format"),
           ({"tools": [unique], "tool_choice": "required"}, "tool_choice", "uniqueItems at #/items/properties/"
                                                                          "arguments/properties/xs is not supported"),
           ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools", "String should match pattern"),
           ({"tools": TOOLS, "messages": [], "prompt": "x"}, "tools", "tools need 'messages'"),
           ({"messages": [{"role": "tool", "content": "x"}]}, "messages", "messages.0: a tool message needs tool_call_id"),
           ({"messages": [{"role": "user", "content": "x", "tool_call_id": "c"}]}, "messages", "only tool messages"),
           ({"messages": [{"role": "user"}]}, "messages", "messages.0: a user message needs content"),
           ({"messages": [{"role": "user", "content": "x", "tool_calls": [bad_args]}]}, "messages",
            "only assistant messages have tool_calls"),
           ({"messages": [{"role": "assistant", "tool_calls": [bad_args]}]}, "messages",
            "the arguments of the call to 'get_time' must be a JSON object")]
    for body, param, message in bad:
        body = {"model": "m", "messages": ask, "max_tokens": 8, **body}
        response = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=60)
        error = response.json()["error"]
        assert response.status_code == 400 and error["param"] == param and message in error["message"], error
    assert template_writes_tool_calls(str(tiny_qwen3)) and not template_writes_tool_calls(str(smollm2))
    t0 = time.monotonic()
    while (m := metrics(port))["minisgl_num_running_requests"] or m["minisgl_kv_pages_used"]:
        assert time.monotonic() - t0 < 5, m
        time.sleep(0.05)
    assert "Traceback" not in log.read_text()

def test_reasoning_parser_any_split() -> None:
    """开头的 <think>…</think> 切成思考、其余是内容；不以 <think> 开头的、只有空白或半个标记的、没写完思考的：
    每一个切分点切成两段喂、一个字符一个字符地喂，都和整段喂一次相同。"""
    cases = {"<think>\nThe user wants the weather.\n</think>\n\nIt is sunny.": ("The user wants the weather.",
                                                                               "It is sunny."),
             "  <think>\n\n</think>\n\nHi": ("", "Hi"), "Sure <think>x</think>": ("", "Sure <think>x</think>"),
             "\n": ("", "\n"), "<thi": ("", "<thi"), "<think>\nnot done </thi": ("not done </thi", ""),
             "<think> a </think> b <think>c</think>": ("a", "b <think>c</think>")}

    opened = {"The user wants the weather.\n</think>\n\nIt is sunny.": ("The user wants the weather.", "It is sunny."),
              "\n<think>\nx</think>y": ("x", "y"), " still thinking \n": ("still thinking", ""), "<th": ("<th", ""),
              "": ("", ""), "</think>\n\nHi": ("", "Hi")}  # 提示词已经以 <think> 结尾
    for table, is_opened in [(cases, False), (opened, True)]:
        for text, want in table.items():
            assert cut(ReasoningParser(is_opened), [text]) == cut(ReasoningParser(is_opened), list(text)) == want, text
            for k in range(len(text) + 1):
                assert cut(ReasoningParser(is_opened), [text[:k], text[k:]]) == want, (text, k)

def test_server_reasoning(server, tiny_qwen3, smollm2) -> None:
    """Qwen3 的模板会思考：ebnf 让随机模型写出 <think>…</think> 和回答，思考进 reasoning_content，流式和非流式
    一样；separate_reasoning=false 时原样在 content 里；思考之后是工具调用时三样各归各位。SmolLM2 不思考。"""
    port, _ = server
    c = client(port)
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]

    def forced(said: str, **kwargs: Any) -> Dict[str, Any]:
        return dict(model="m", messages=ask, max_tokens=300, temperature=0,
                    extra_body={"ebnf": f"root ::= {json.dumps(said)}", **kwargs.pop("extra_body", {})}, **kwargs)

    said = "<think>\nThe user wants the weather.\n</think>\n\nIt is sunny in Paris."
    answer = c.chat.completions.create(**forced(said), logprobs=True)
    whole = answer.choices[0].message
    assert (whole.reasoning_content, whole.content) == ("The user wants the weather.", "It is sunny in Paris.")
    tokens = [t.token for t in answer.choices[0].logprobs.content]  # 只有内容的 token（和 </think> 之后丢掉的空行）
    assert "".join(tokens).lstrip() == whole.content, tokens
    assert answer.usage.completion_tokens_details.reasoning_tokens + len(tokens) <= answer.usage.completion_tokens
    chunks = list(c.chat.completions.create(**forced(said), stream=True, logprobs=True,
                                            stream_options={"include_usage": True}))
    assert "".join(getattr(ch.choices[0].delta, "reasoning_content", None) or "" for ch in chunks[:-1]) == \
        whole.reasoning_content
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks[:-1]) == whole.content
    assert chunks[-1].usage.completion_tokens_details == answer.usage.completion_tokens_details
    with_logprobs = [ch.choices[0] for ch in chunks[:-1] if ch.choices[0].logprobs]  # 流式：只有内容的片段带着
    assert all(choice.delta.content for choice in with_logprobs), with_logprobs
    assert [t.token for choice in with_logprobs for t in choice.logprobs.content] == tokens
    kept = c.chat.completions.create(**forced(said, extra_body={"separate_reasoning": False})).choices[0].message
    assert kept.content == said and getattr(kept, "reasoning_content", None) is None
    call = {"name": "get_time", "arguments": {}}
    both = c.chat.completions.create(**forced(f"<think>\nCall it.\n</think>\n\n<tool_call>\n{json.dumps(call)}\n"
                                              f"</tool_call>", tools=TOOLS)).choices[0]
    assert (both.message.reasoning_content, both.message.content, both.finish_reason) == ("Call it.", None,
                                                                                         "tool_calls")
    assert [(t.function.name, t.function.arguments) for t in both.message.tool_calls] == [("get_time", "{}")]
    result = {"role": "tool", "tool_call_id": both.message.tool_calls[0].id, "content": "12:00"}
    again = c.chat.completions.create(model="m", messages=ask + [both.message, result], tools=TOOLS, max_tokens=2,
                                      temperature=0)  # 客户端把回答对象原样放回 messages：思考也跟着回来
    rendered = ask + [{"role": "assistant", "content": "", "reasoning_content": "Call it.", "tool_calls": [
        {"id": both.message.tool_calls[0].id, "type": "function", "function": call}]}, result]
    want = load_tokenizer(tiny_qwen3).apply_chat_template(rendered, tools=TOOLS, add_generation_prompt=True,
                                                          tokenize=False)
    assert "<think>\nCall it.\n</think>" in want
    assert again.usage.prompt_tokens == len(load_tokenizer(tiny_qwen3).encode(want, add_special_tokens=False))
    plain = c.chat.completions.create(model="m", messages=ask, max_tokens=5, temperature=0)
    assert "reasoning_content" not in plain.choices[0].message.model_dump(exclude_unset=True)  # 没思考：没有这个键
    assert plain.usage.completion_tokens_details is None
    assert template_thinks(str(tiny_qwen3)) and not template_thinks(str(smollm2))
    assert prompt_thinking(str(tiny_qwen3), "{}") == "tagged"  # Qwen3 的 <think> 由模型自己写
    assert prompt_thinking(str(tiny_qwen3), json.dumps({"enable_thinking": False})) == "closed"  # 空的思考已经关上

@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(words=st.lists(st.sampled_from(["<think>", "</think>", "<tool_call>", "</tool_call>", "<", "/", "think>",
                                       "_call>", " ", "\n", "Hi", '{"name": "get_time", "arguments": {}}', "{",
                                       '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>']),
                      max_size=16),
       cuts=st.lists(st.integers(0, 300), max_size=6), opened=st.booleans(), parallel=st.booleans())
def test_splitters_any_split(words: List[str], cuts: List[int], opened: bool, parallel: bool) -> None:
    """服务里两个切分器串在一起（_split：先切思考，剩下的再切调用）：随机拼出来的文字（标记、半个标记、空白、
    调用）在随机的几处切开、在每一处切成两段、一个字符一个字符地喂，切出的思考、内容和调用都和整段喂一次相同。"""
    from minisgl.server.api_server import _split, _splitter
    from minisgl.server.tools import ToolCalls

    def run(pieces: List[str]) -> Tuple[str, str, List[Dict[str, Any]]]:
        parser = _splitter("opened" if opened else "tagged", ToolCalls(TOOLS, parallel=parallel), 1)
        outs = [_split(parser, piece, k == len(pieces) - 1) for k, piece in enumerate(pieces)]
        return "".join(o[0] for o in outs), "".join(o[1] for o in outs), [c for o in outs for c in o[2]]

    text = "".join(words)
    whole = run([text])
    points = sorted({min(c, len(text)) for c in cuts})
    assert run([text[a:b] for a, b in zip([0] + points, points + [len(text)])]) == whole
    assert run(list(text)) == whole
    for k in range(len(text) + 1):
        assert run([text[:k], text[k:]]) == whole, k

def test_responses_output_items() -> None:
    """Responses 的输出项由 _Output 一条回复一条回复地建：思考、文字、调用依次成为 reasoning、message、function_call
    项，output_index 按出现的先后。一个字符一条回复地喂，和整段一条回复，最后的项相同；每一项的事件从 added 开始、
    到 done 结束，delta 拼起来就是项里的文字（调用是参数）；思考在文字出现之前写完；reasoning_tokens 是到 </think>
    为止的回复数。端到端的测试里随机模型写不出 </think>，这里把三种项的交接都走一遍。"""
    from minisgl.server.api_server import _Output, _splitter
    from minisgl.server.tools import ToolCalls

    said = '<think>\nPlan it.\n</think>\n\nChecking.\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'

    def run(pieces: List[str], top: int | None = None) -> Tuple[_Output, List[Tuple[str, Dict[str, Any]]]]:
        events: List[Tuple[str, Dict[str, Any]]] = []
        out = _Output("7", _splitter("tagged", ToolCalls(TOOLS), 7), lambda kind, **body: events.append((kind, body))
                      or b"", top)
        for k, piece in enumerate(pieces):
            last = k == len(pieces) - 1
            lp = None if top is None else [{"token": piece, "bytes": list(piece.encode()), "logprob": -0.5,
                                             "top_logprobs": [{"token": "x", "bytes": [120], "logprob": -1.0}] * 2}]
            out.feed(UserReply(uid=7, incremental_output=piece, finished=last, finish_reason="stop" if last else None,
                               logprobs=lp))
        return out, events

    whole, _ = run([said])
    assert [item["type"] for item in whole.items] == ["reasoning", "message", "function_call"]
    assert (whole.items[0]["content"][0]["text"], whole.items[1]["content"][0]["text"]) == ("Plan it.", "Checking.")
    assert whole.items[2]["name"] == "get_time" and whole.items[2]["call_id"] == "call_7_0"
    out, events = run(list(said) + [""])
    assert out.items == whole.items and out.parser.reasoning_tokens == said.index("</think>") + len("</think>")
    for index, item in enumerate(out.items):
        mine = [(kind, body) for kind, body in events if body.get("output_index") == index]
        assert mine[0][0] == "response.output_item.added" and mine[-1] == ("response.output_item.done",
                                                                            {"output_index": index, "item": item})
        written = "".join(body["delta"] for kind, body in mine if kind.endswith(".delta"))
        assert written == (item["arguments"] if item["type"] == "function_call" else item["content"][0]["text"])
    kinds = [kind for kind, _ in events]
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_text.delta")
    assert whole.items[1]["content"][0]["logprobs"] == [] and all(  # 没要 logprobs：空的
        body["logprobs"] == [] for kind, body in events if kind.startswith("response.output_text."))
    # 要了（每个位置另给 1 个）：一个字符一条回复、各带一项。message 项只拿到写出它的文字的几项（连同 </think> 之后扣着
    # 的空行），思考、</think>、调用的不算；事件里的每一项没有 bytes
    out, events = run(list(said) + [""], top=1)
    assert out.items[1]["content"][0]["text"] == "Checking."
    assert [(e["token"], e["bytes"], len(e["top_logprobs"])) for e in out.items[1]["content"][0]["logprobs"]] == \
        [(ch, list(ch.encode()), 1) for ch in "\n\nChecking."]
    deltas = [e for kind, body in events if kind == "response.output_text.delta" for e in body["logprobs"]]
    assert deltas == [{"token": ch, "logprob": -0.5, "top_logprobs": [{"token": "x", "logprob": -1.0}]}
                      for ch in "\n\nChecking."]
    assert next(body for kind, body in events if kind == "response.output_text.done")["logprobs"] == deltas

def test_server_responses_text_format(server) -> None:
    """Responses API 的 text.format：json_schema（官方客户端的 responses.parse 从 pydantic 模型生成它）解析得出模型，
    流式拼起来和非流式相同，响应里写着这个格式；json_object 的输出和对话接口的 response_format 逐字相同（同一个
    提示词、同一个语法）；坏的格式是 400、指明 text，和强制调用一起给是 400。"""
    port, _ = server
    c = client(port)

    class Weather(pydantic.BaseModel):
        city: str = pydantic.Field(max_length=12)
        unit: Literal["celsius", "fahrenheit"]

    ask = dict(model="m", input="What is the weather in Paris?", max_output_tokens=200, temperature=0,
               extra_body=DIRECT)
    r = c.responses.parse(**ask, text_format=Weather)
    assert r.status == "completed" and isinstance(r.output_parsed, Weather)
    fmt = r.text.format.model_dump(by_alias=True, exclude_none=True)
    assert fmt["type"] == "json_schema" and fmt["name"] == "Weather" and fmt["schema"]["properties"]["city"]["maxLength"] == 12
    events = list(c.responses.create(**ask, text={"format": fmt}, stream=True))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == r.output_text
    assert events[-1].response.text.format.name == "Weather"
    obj = c.responses.create(**ask | {"input": "x"}, text={"format": {"type": "json_object"}})
    chat = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=200,
                                     temperature=0, response_format={"type": "json_object"}, extra_body=DIRECT)
    assert obj.output_text == chat.choices[0].message.content and obj.text.format.type == "json_object"
    bad = [({"text": {"format": {"type": "json_schema", "name": "a"}}}, "text", 'needs "name" and "schema"'),
           ({"text": {"format": {"type": "json_schema", "name": "a", "schema": {"type": "array", "uniqueItems": True}}}},
            "text", "text: "),
           ({"text": {"verbosity": "high"}}, "text", "text.verbosity"),
           ({"text": {"format": {"type": "json_object"}}, "tools": [{"type": "function", "name": "f"}],
             "tool_choice": "required"}, "tool_choice", "cannot be combined with text")]
    for body, param, message in bad:
        response = httpx.post(f"http://127.0.0.1:{port}/v1/responses", timeout=60,
                              json={**{k: v for k, v in ask.items() if k != "extra_body"}, **DIRECT, **body})
        error = response.json()["error"]
        assert response.status_code == 400 and error["param"] == param and message in error["message"], error

def test_server_responses_store(server) -> None:
    """previous_response_id：服务记下的对话接上这一轮的项，提示词和把整段对话发回来时一样长、贪心的回答一样（调用
    工具的一轮，再说两句的两轮，其中一轮是流式的）；instructions 只用这一轮的；retrieve 拿回同一个响应对象，delete
    之后是 404；删掉的、store=false 的、从没有过的 previous_response_id 是 400；ResponseStore 先忘最久没用到的。"""
    from minisgl.server.api_server import ResponseStore, _Stored

    port, _ = server
    c = client(port)
    flat = [{"type": "function", **t["function"]} for t in TOOLS]
    ask = "What is the weather in Paris?"
    first = c.responses.create(model="m", input=ask, tools=flat, instructions="Be brief.", temperature=0,
                               max_output_tokens=200, tool_choice={"type": "function", "name": "get_weather"},
                               extra_body=DIRECT)
    result = {"type": "function_call_output", "call_id": first.output[0].call_id, "output": "18 degrees, sunny"}
    whole = [{"role": "user", "content": ask}] + [o.model_dump(exclude_none=True) for o in first.output] + [result]

    def turn(**kwargs: Any) -> Any:
        return c.responses.create(model="m", tools=flat, temperature=0, max_output_tokens=3, **kwargs)

    explicit, chained = turn(input=whole), turn(input=[result], previous_response_id=first.id)
    assert (chained.usage.input_tokens, chained.output_text) == (explicit.usage.input_tokens, explicit.output_text)
    assert chained.previous_response_id == first.id and chained.store and explicit.previous_response_id is None
    briefed = turn(input=[result], previous_response_id=first.id, instructions="Be brief.")  # 只用这一轮的
    assert briefed.usage.input_tokens == turn(input=whole, instructions="Be brief.").usage.input_tokens > \
        explicit.usage.input_tokens
    events = list(c.responses.create(model="m", tools=flat, temperature=0, max_output_tokens=3, input="Thanks!",
                                     previous_response_id=chained.id, stream=True))
    streamed = events[-1].response
    later = turn(input="And tomorrow?", previous_response_id=streamed.id)
    full = whole + [o.model_dump(exclude_none=True) for o in chained.output] + [{"role": "user", "content": "Thanks!"}] \
        + [o.model_dump(exclude_none=True) for o in streamed.output] + [{"role": "user", "content": "And tomorrow?"}]
    assert later.usage.input_tokens == turn(input=full).usage.input_tokens

    assert c.responses.retrieve(streamed.id).model_dump() == streamed.model_dump()
    c.responses.delete(streamed.id)
    for gone in (lambda: c.responses.retrieve(streamed.id), lambda: c.responses.delete(streamed.id)):
        with pytest.raises(NotFoundError):
            gone()
    unstored = turn(input="x", store=False)
    assert unstored.store is False
    for rid in (streamed.id, unstored.id, "resp_none"):
        response = httpx.post(f"http://127.0.0.1:{port}/v1/responses", timeout=60,
                              json={"model": "m", "input": "x", "max_output_tokens": 2, "previous_response_id": rid})
        error = response.json()["error"]
        assert response.status_code == 400 and error["param"] == "previous_response_id", error
        assert error["code"] == "previous_response_not_found" and rid in error["message"]

    store = ResponseStore(2)
    for rid in "abc":
        store.put(rid, _Stored({"id": rid}, []))
        store.get("a")  # a 一直在用：b 先被忘
    assert store.get("a") is not None and store.get("b") is None and store.get("c") is not None

def test_thinking_grammar(vocab: Vocab) -> None:
    """ThinkingGrammar：start 时允许的是语法的加上 <think>；think 时除了结束符全放行，matcher 是 None（成批填掩码时
    这一行自己填）；</think> 之后就是原来的语法，写完才 is_terminated；opened 从 think 开始；语法自己规定了 <think>
    时全交给语法。SmolLM2 的词表里没有这两个标记：state() 给的是普通的 Grammar。"""
    backend = vocab.backend
    compiled = backend.compile("json_schema", json.dumps(PICK))
    if backend.think is None:
        assert type(backend.state(compiled, "tagged")) is Grammar
        return
    (start, end), stops = backend.think, backend.stop_token_ids
    plain = Grammar(compiled).allowed()  # [V] bool
    g = backend.state(compiled, "tagged")
    with_start = plain.clone()
    with_start[start] = True
    assert torch.equal(g.allowed(), with_start) and not plain[start]
    assert g.accept(start) and g.matcher is None
    thinking = g.allowed()
    assert not thinking[stops].any() and int(thinking.sum()) == vocab.size - len(set(stops))
    assert all(g.accept(t) for t in vocab.tokenizer.encode(" a is 3", add_special_tokens=False))
    assert not g.accept(stops[0]) and not g.is_terminated and g.accept(end)
    assert g.matcher is not None and torch.equal(g.allowed(), plain)
    assert json.loads(generate(vocab, g, seed=0, bias=3.0))["a"] in (1, 2, 3) and g.is_terminated

    opened = backend.state(compiled, "opened")
    mask = allocate_vocab_mask(2, vocab.size)
    fill_vocab_mask([opened, Grammar(compiled)], mask)
    assert torch.equal(unpack_vocab_mask(mask, vocab.size)[0], thinking) and opened.matcher is None
    assert torch.equal(unpack_vocab_mask(mask, vocab.size)[1], plain)
    spelled = backend.state(backend.compile("ebnf", 'root ::= "<think>" [a-z]* "</think>" "ok"'), "tagged")
    assert spelled.grammar_thinks and spelled.accept(start) and spelled.state == "answer"

def test_server_grammar_after_thinking(server, tiny_qwen3) -> None:
    """Qwen3 的模板会思考：受约束的请求让模型先想，语法等 </think> 之后再管。logit_bias 让随机模型先写 <think>、
    再写 </think>，思考是空的，回答合乎 schema，思考的 token 是 2 个（内容的 logprobs 里没有它们）；关掉思考
    （enable_thinking: false）或不切思考（separate_reasoning: false）时语法从第一个 token 管起，<think> 写不出来。"""
    port, _ = server
    c = client(port)
    tokenizer = load_tokenizer(tiny_qwen3)
    bias = {str(tokenizer.convert_tokens_to_ids("<think>")): 50, str(tokenizer.convert_tokens_to_ids("</think>")): 100}
    ask = dict(model="m", messages=[{"role": "user", "content": "Pick one."}], max_tokens=50, temperature=0,
               response_format=schema_format(PICK), logit_bias=bias)
    r = c.chat.completions.create(**ask, logprobs=True)
    assert r.choices[0].finish_reason == "stop" and json.loads(r.choices[0].message.content)["a"] in (1, 2, 3)
    assert getattr(r.choices[0].message, "reasoning_content", None) is None
    assert r.usage.completion_tokens_details.reasoning_tokens == 2  # <think> 和 </think>：不在内容的 logprobs 里
    assert "".join(t.token for t in r.choices[0].logprobs.content).lstrip() == r.choices[0].message.content
    for extra in (DIRECT, {"separate_reasoning": False}):
        direct = c.chat.completions.create(**ask, extra_body=extra).choices[0]
        assert direct.finish_reason == "stop" and json.loads(direct.message.content)["a"] in (1, 2, 3), extra

def test_server_opened_thinking(tiny_qwen3, tmp_path) -> None:
    """模板替模型写好了 <think>（DeepSeek-R1 的蒸馏模型、Qwen3 Thinking-2507 的写法）：回答从第一个字起是思考。随机
    模型写不出 </think>，整个回答都是思考：对话接口的 reasoning_content 就是 separate_reasoning=false 时的 content
    （两头的空白除外），流式和非流式一样，reasoning_tokens 是全部 token；Responses 的输出只有一个 reasoning 项，事件
    逐个核对；强制的调用不是思考（语法从第一个 token 起管着输出）；思考力度 none 关不上这种模板的思考，是 400。"""
    model = tmp_path / "opened"
    shutil.copytree(tiny_qwen3, model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    head, mark, tail = config["chat_template"].rpartition("{{- '<|im_start|>assistant\\n' }}")
    config["chat_template"] = head + "{{- '<|im_start|>assistant\\n<think>\\n' }}" + tail.replace(
        "enable_thinking is defined and enable_thinking is false", "false")  # 像 R1 的蒸馏模型：不认 enable_thinking
    assert "enable_thinking" not in config["chat_template"]
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    assert mark and prompt_thinking(str(model), "{}") == "opened"
    proc, port = start_server(model, tmp_path / "server.log", "--max-seq-len-override", "512")
    try:
        c = client(port)
        ask = dict(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=12, temperature=0)
        raw = c.chat.completions.create(**ask, extra_body={"separate_reasoning": False}).choices[0].message.content
        whole = c.chat.completions.create(**ask)
        assert (whole.choices[0].message.reasoning_content, whole.choices[0].message.content) == (raw.strip(), "")
        assert whole.usage.completion_tokens_details.reasoning_tokens == 12 and "</think>" not in raw
        with pytest.raises(BadRequestError) as e:  # 这个模板关不上思考：思考力度 none 不能悄悄照想不误
            c.chat.completions.create(**ask, reasoning_effort="none")
        assert "cannot turn its thinking off" in e.value.body["message"], e.value.body
        chunks = list(c.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True}))
        assert "".join(getattr(ch.choices[0].delta, "reasoning_content", None) or "" for ch in chunks[:-1]) == \
            raw.strip() and chunks[-1].usage == whole.usage

        r = c.responses.create(model="m", input="Hi", max_output_tokens=12, temperature=0)
        assert r.status == "incomplete" and [o.type for o in r.output] == ["reasoning"]
        assert r.output[0].content[0].text == raw.strip() and r.usage.output_tokens_details.reasoning_tokens == 12
        events = list(c.responses.create(model="m", input="Hi", max_output_tokens=12, temperature=0, stream=True))
        kinds = [e.type for e in events]
        assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                             "response.content_part.added"]
        assert kinds[-4:] == ["response.reasoning_text.done", "response.content_part.done",
                              "response.output_item.done", "response.incomplete"]
        assert set(kinds[4:-4]) == {"response.reasoning_text.delta"}
        assert "".join(e.delta for e in events[4:-4]) == events[-4].text == raw.strip()
        assert [o.type for o in events[-1].response.output] == ["reasoning"] and events[-2].item.status == "completed"
        assert events[-1].response.output[0].content[0].text == raw.strip()

        # 受约束的请求：语法等思考写完再管。思考里随机模型照旧写（和不受约束时一字不差），写不完就是 length
        forever = c.chat.completions.create(**ask, response_format={"type": "json_object"}).choices[0]
        assert (forever.message.reasoning_content, forever.finish_reason) == (raw.strip(), "length")
        stop = {"max_tokens": 200, "logit_bias": {str(load_tokenizer(model).convert_tokens_to_ids("</think>")): 100}}
        named = c.chat.completions.create(**ask | stop, tools=TOOLS,  # 第一个 token 就是 </think>：思考是空的
                                          tool_choice={"type": "function", "function": {"name": "get_time"}})
        message = named.choices[0].message
        assert [t.function.name for t in message.tool_calls] == ["get_time"] and message.content is None
        assert getattr(message, "reasoning_content", None) is None
        assert named.usage.completion_tokens_details.reasoning_tokens == 1
        picked = c.chat.completions.create(**ask | stop, response_format=schema_format(PICK)).choices[0]
        assert picked.finish_reason == "stop" and json.loads(picked.message.content)["a"] in (1, 2, 3)
    finally:
        stop_server(proc)

def test_server_responses_tool_calls(server, tiny_qwen3) -> None:
    """Responses API 的函数工具（扁平的形状）：指定函数时输出只有一个 function_call 项（没写文字，没有 message 项）；流式的事件
    依次是 OpenAI 规定的那些，最后的 response 和非流式的相同；上一轮的 function_call 和 function_call_output 放进
    input，提示词和分词器自己套模板的一样长；坏的 input 项、不是函数的工具都是 400；最后请求槽和 KV 页都回来。"""
    port, _ = server
    c = client(port)
    flat = [{"type": "function", **t["function"]} for t in TOOLS]
    ask = "What is the weather in Paris?"
    named = dict(model="m", input=ask, tools=flat, tool_choice={"type": "function", "name": "get_weather"},
                 temperature=0, max_output_tokens=200, extra_body=DIRECT)
    r = c.responses.create(**named)
    assert r.status == "completed" and [o.type for o in r.output] == ["function_call"]  # 没写文字：没有 message 项
    call = r.output[0]
    assert call.name == "get_weather" and re.fullmatch(r"call_\d+_0", call.call_id) and call.id.startswith("fc_")
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    assert r.tool_choice.name == "get_weather" and r.parallel_tool_calls
    assert [t.name for t in r.tools] == ["get_weather", "get_time"]
    events = list(c.responses.create(**named, stream=True))
    assert [e.type for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.done", "response.output_item.done",
        "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    done = events[-1].response
    assert events[3].delta == events[4].arguments == done.output[0].arguments == call.arguments  # 贪心：和非流式一样
    assert [o.type for o in done.output] == ["function_call"] and done.output[0].name == "get_weather"
    plain = c.responses.create(model="m", input=ask, max_output_tokens=4, temperature=0, include=[])  # Agents SDK 总带着它
    assert [o.type for o in plain.output] == ["message"]  # 不带工具、没思考：和第 15 章一样只有一个 message 项
    assert c.responses.create(model="m", input=ask, max_output_tokens=4, temperature=0,
                              include=["reasoning.encrypted_content"]).output[0].content[0].text == \
        plain.output[0].content[0].text

    args = {"city": "Paris", "unit": "celsius"}
    turn = [{"role": "user", "content": ask},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": json.dumps(args)},
            {"type": "function_call_output", "call_id": "call_1", "output": "18 degrees, sunny"}]
    rendered = [{"role": "user", "content": ask},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": args}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny"}]
    want = len(load_tokenizer(tiny_qwen3).apply_chat_template(rendered, tools=TOOLS, add_generation_prompt=True,
                                                             tokenize=True, return_dict=True)["input_ids"])
    assert c.responses.create(model="m", input=turn, tools=flat, max_output_tokens=2,
                              temperature=0).usage.input_tokens == want
    follow = [turn[0]] + [o.model_dump(exclude_none=True) for o in r.output] + [  # 上一个回答的输出项原样放回来
        {"type": "function_call_output", "call_id": call.call_id, "output": "18 degrees, sunny"}]
    rendered[1]["tool_calls"][0].update(id=call.call_id, function={"name": "get_weather",
                                                                   "arguments": json.loads(call.arguments)})
    want = len(load_tokenizer(tiny_qwen3).apply_chat_template(rendered, tools=TOOLS, add_generation_prompt=True,
                                                             tokenize=True, return_dict=True)["input_ids"])
    assert c.responses.create(model="m", input=follow, tools=flat, max_output_tokens=2,
                              temperature=0).usage.input_tokens == want
    thought = {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text",
                                                                             "text": "Call it."}]}
    rendered[1]["reasoning_content"] = "Call it."  # 思考项送回来：成了这一轮 assistant 消息的 reasoning_content
    want = load_tokenizer(tiny_qwen3).apply_chat_template(rendered, tools=TOOLS, add_generation_prompt=True,
                                                          tokenize=False)
    assert "<think>\nCall it.\n</think>" in want
    assert c.responses.create(model="m", input=[follow[0], thought] + follow[1:], tools=flat, max_output_tokens=2,
                              temperature=0).usage.input_tokens == len(load_tokenizer(tiny_qwen3).encode(
                                  want, add_special_tokens=False))

    bad = [({"input": turn[:1] + [{**turn[1], "arguments": "{oops"}]}, "input", "arguments that are a JSON object"),
           ({"input": [turn[2] | {"call_id": None}]}, "input", "needs a call_id"),
           ({"input": [turn[2] | {"output": 3}]}, "input", "must be text"),
           ({"input": [thought | {"content": [{"type": "summary_text", "text": "x"}]}]}, "input", "reasoning_text"),
           ({"include": ["file_search_call.results"]}, "include", "message.output_text.logprobs"),
           ({"tools": [{"type": "web_search"}]}, "tools", "tools.0"),
           ({"tools": flat, "tool_choice": {"type": "function", "name": "fly"}}, "tool_choice", "not in tools")]
    for body, param, message in bad:
        body = {"model": "m", "input": ask, "max_output_tokens": 8, **body}
        response = httpx.post(f"http://127.0.0.1:{port}/v1/responses", json=body, timeout=60)
        error = response.json()["error"]
        assert response.status_code == 400 and error["param"] == param and message in error["message"], error
    t0 = time.monotonic()
    while (m := metrics(port))["minisgl_num_running_requests"] or m["minisgl_kv_pages_used"]:
        assert time.monotonic() - t0 < 5, m
        time.sleep(0.05)


Case = Tuple[Dict[str, Any], str, str]  # (请求体里多出的字段, 错误的 param, 错误消息里的一段)

def assert_400s(port: int, ask: List[Dict[str, Any]], chat: List[Case], responses: List[Case]) -> None:
    """对话接口（messages=ask）和 Responses（input=ask）各发一遍这些请求：每个都是 400，param 和消息都对。"""
    for path, cases in [("/v1/chat/completions", [({"messages": ask, **b}, p, m) for b, p, m in chat]),
                        ("/v1/responses", [({"input": ask, **b}, p, m) for b, p, m in responses])]:
        for body, param, message in cases:
            r = httpx.post(f"http://127.0.0.1:{port}{path}", json={"max_tokens" if "chat" in path else
                                                                   "max_output_tokens": 4, **body}, timeout=60)
            error = r.json()["error"]
            assert r.status_code == 400 and error["param"] == param and message in error["message"], (body, error)

def test_json_the_server_cannot_use_is_400(server) -> None:
    """服务用不了的 JSON：套了几百层的工具参数 schema 和 chat_template_kwargs、调用参数里上千层的数组、几千位的整数、
    NaN，不是对象的函数参数，带了 json_schema 的 json_object。都是指明参数的 400（不是 5xx），服务照常回答；模型自己写出
    上千层的调用时，切分器把它当作不是调用（json_or_none 不抛异常）。"""
    from minisgl.server.api_server import _split, _splitter
    from minisgl.server.tools import ToolCalls

    port, _ = server
    deep = json.loads("[" * 600 + "]" * 600)
    ask = [{"role": "user", "content": "What time is it?"}]
    weird = ["[" * 3000 + "]" * 3000, '{"a": ' + "1" * 5000 + "}", '{"a": NaN}']
    called = [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": args}}]} for args in weird]
    chat = [({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "x": deep}}}]},
             "tools", "levels deep"),
            ({"messages": ask + [called[0]]}, "messages", "JSON object"),
            ({"messages": ask + [called[1]]}, "messages", "JSON object"),
            ({"messages": ask + [called[2]]}, "messages", "JSON object"),
            ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "null"}}}]},
             "tools", "JSON Schema of an object"),
            ({"response_format": {"type": "json_object", "json_schema": {"name": "x", "schema": {}}}},
             "response_format", 'only used with type "json_schema"'),
            ({"logit_bias": {"²": 1}}, "logit_bias", "keys are token ids")]
    responses = [({"chat_template_kwargs": {"x": deep}}, "chat_template_kwargs", "levels deep"),
                 ({"tools": [{"type": "function", "name": "f", "parameters": {"type": "array"}}]}, "tools",
                  "JSON Schema of an object")]
    responses += [({"input": ask + [{"type": "function_call", "call_id": "c1", "name": "get_time", "arguments": args}]},
                   "input", "JSON object") for args in weird]
    assert_400s(port, ask, chat, responses)
    assert client(port).chat.completions.create(model="m", messages=ask, max_tokens=2).choices[0].finish_reason
    said = '<tool_call>\n{"name": "get_time", "arguments": {"a": ' + "[" * 1500 + "]" * 1500 + "}}\n</tool_call>"
    thought, content, calls = _split(_splitter(None, ToolCalls(TOOLS), 1), said, True)
    assert (thought, calls) == ("", []) and content == said  # 不是合法的 JSON：原样是内容

def test_what_the_server_sets_is_400(server) -> None:
    """chat_template_kwargs 里放 apply_chat_template 自己的参数、对话接口同时给 messages 和 prompt、Responses 的空 input
    和不是函数的工具：都是指明参数的 400。不然 tools: 5 是一句 transformers 的话、算在 messages 头上，tokenize 撞车，
    continue_final_message 绕过它自己的检查、接着 user 消息写，prompt 被悄悄丢掉。模板的变量照收。"""
    port, _ = server
    ask = [{"role": "user", "content": "Hi"}]
    chat = [({"chat_template_kwargs": {key: value}}, "chat_template_kwargs",
             f"{key!r} is an argument of apply_chat_template")
            for key, value in [("tools", 5), ("add_generation_prompt", False), ("continue_final_message", True),
                               ("tokenize", True), ("return_dict", True)]]
    chat += [({"prompt": "Hi"}, "prompt", "give 'messages' or 'prompt', not both")]
    responses = [({"chat_template_kwargs": {"chat_template": "{{ 1 }}"}}, "chat_template_kwargs",
                  "'chat_template' is an argument of apply_chat_template"),
                 ({"input": []}, "input", "input is empty"),
                 ({"tools": [{"type": "web_search"}]}, "tools", "type 'web_search' is not supported")]
    assert_400s(port, ask, chat, responses)
    answer = client(port).chat.completions.create(model="m", messages=ask, max_tokens=2,
                                                  extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert answer.choices[0].finish_reason == "length"


@pytest.mark.gpu
def test_gpu_cuda_graphs_and_overlap(tiny_qwen3_hd128, checker: GrammarBackend, monkeypatch) -> None:
    """GPU：bf16、FlashInfer 注意力、CUDA Graph、重叠调度都开着。decode 批从图里回放，掩码拷到 GPU 上、盖在图外的
    logits 上；贪心、带 seed 的采样和 FlashInfer 的采样（没有 seed）都只写出合法的输出；槽、页、语法状态全回来。"""
    pytest.importorskip("flashinfer")
    from minisgl.engine.graph import GraphRunner

    replayed: List[int] = []
    replay = GraphRunner.replay

    def counting(self, batch):
        replayed.append(batch.size)
        return replay(self, batch)

    monkeypatch.setattr(GraphRunner, "replay", counting)
    llm = LLM(tiny_qwen3_hd128, device="cuda", dtype="bfloat16", attention_backend="fi", page_size=16,
              num_pages=1024, max_seq_len_override=512, cuda_graph_max_bs=16, enable_overlap=True)
    try:
        assert llm.engine.graph_runner.batch_sizes, "CUDA graphs were not captured"
        prompts, params = mixed_requests()
        person = json.dumps(PERSON)
        prompts += [f"Person {i}:" for i in range(4)]
        params += [SamplingParams(max_tokens=200, json_schema=person, temperature=1.0, top_p=0.9)] * 4  # FlashInfer
        outs = llm.generate(prompts, params, use_tqdm=False)
        for sp, out in zip(params, outs):
            if sp.grammar is not None:
                check_output(checker, sp, out)
        assert all(o["finish_reason"] == "stop" for o in outs[-4:])
        assert replayed and llm._mask_device is not None and llm._mask_device.is_cuda
        assert not llm.grammars and llm.table.num_free == llm.config.max_running_req
        llm.cache.check_integrity()
    finally:
        llm.shutdown()
