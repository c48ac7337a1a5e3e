# Tangled from book/chapters/ch17_structured.ipynb — edit the notebook, not this file.
"""附录·结构化输出：语法层（minisgl/structured/）。真实的 Qwen3 与 SmolLM2 分词器，随机生成的 JSON Schema、正则和
EBNF，一个随机 logits 的"模型"在掩码下生成——输出总能解析，并且合乎它的 schema / 正则。"""
from __future__ import annotations

import ast
import json
import random
import re
from typing import Any, List, NamedTuple

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

xgr = pytest.importorskip("xgrammar", reason="xgrammar is not installed: pip install -e '.[structured]'")
jsonschema = pytest.importorskip("jsonschema")

from minisgl.structured import (JSON_OBJECT_SCHEMA, Grammar, GrammarBackend, allocate_vocab_mask,  # noqa: E402
                                apply_vocab_mask, check_grammar, fill_vocab_mask, unpack_vocab_mask)
from minisgl.utils.hf import load_tokenizer, qwen3_tokenizer_dir  # noqa: E402

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


def regex_of(node: tuple) -> str:
    kind, *args = node
    if kind == "lit":
        return args[0]
    if kind == "class":
        return f"[{args[0]}]"
    if kind == "seq":
        return "".join(f"({regex_of(n)})" for n in args[0])
    if kind == "alt":
        return "(" + "|".join(f"({regex_of(n)})" for n in args[0]) + ")"
    return f"({regex_of(args[0])}){args[1]}"

def ebnf_of(node: tuple) -> str:
    """同一棵树写成 EBNF：和 regex_of 描述同一个语言。"""
    kind, *args = node
    if kind == "lit":
        return json.dumps(args[0])
    if kind == "class":
        return f"[{args[0]}]"
    if kind == "seq":
        return " ".join(f"({ebnf_of(n)})" for n in args[0])
    if kind == "alt":
        return "(" + " | ".join(f"({ebnf_of(n)})" for n in args[0]) + ")"
    return f"({ebnf_of(args[0])}){args[1]}"

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
    spec = regex_of(node) if kind == "regex" else "root ::= " + ebnf_of(node)
    text = generate(vocab, vocab.backend.grammar(kind, spec), seed, bias=4.0)
    assert re.fullmatch(regex_of(node), text), (spec, text)

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
])
def test_bad_specs_raise_value_error_naming_them(vocab: Vocab, kind: str, spec: str, reason: str) -> None:
    """编译不了的 spec：check_grammar（不用分词器）和 compile 都抛 ValueError，信息以 kind=spec 开头、说明原因。"""
    for call in (check_grammar, vocab.backend.compile):
        with pytest.raises(ValueError) as e:
            call(kind, spec)
        assert reason in str(e.value)
        assert kind == "xml" or str(e.value).startswith(f"{kind}={spec!r}")

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
