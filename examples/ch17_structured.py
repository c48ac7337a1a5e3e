# Tangled from book/chapters/ch17_structured.ipynb — edit the notebook, not this file.
"""附录：结构化输出的语法层。一个"随机模型"——每一步的 logits 都是随机数——在语法的掩码下也只能写出合法的输出。"""

import json
import re
import time

import jsonschema
import torch

from minisgl.structured import GrammarBackend, allocate_vocab_mask, apply_vocab_mask, unpack_vocab_mask
from minisgl.utils.hf import default_model_path, load_tokenizer, qwen3_tokenizer_dir

torch.set_num_threads(1)
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 8},
        "population": {"type": "integer", "minimum": 0, "maximum": 40000000},
        "is_capital": {"type": "boolean"},
        "districts": {"type": "array", "items": {"enum": ["东城", "西城", "海淀", "朝阳"]}, "maxItems": 3},
    },
    "required": ["city", "population", "is_capital"],
}
PHONE = r"1[3-9][0-9]{9}"
SQL = ('root ::= "SELECT " col (", " col)? " FROM users WHERE " col " " op " " num\n'
       'col ::= "name" | "age" | "city"\n'
       'op ::= "=" | "<" | ">"\n'
       'num ::= [1-9] [0-9]?')


def random_model(backend: GrammarBackend, tokenizer, kind: str, spec: str, seed: int):
    """每一步：随机 logits → 掩码 → argmax → 语法吃进这个 token，直到语法走完（吃进结束符）。"""
    grammar, V = backend.grammar(kind, spec), backend.vocab_size
    gen = torch.Generator().manual_seed(seed)
    mask = allocate_vocab_mask(1, V)
    tokens, allowed = [], []
    while not grammar.is_terminated:
        grammar.fill(mask, 0)
        allowed.append(int(unpack_vocab_mask(mask, V).sum()))
        logits = torch.randn(1, V, generator=gen)  # [1, V]：这个"模型"什么都不懂
        apply_vocab_mask(logits, mask)
        token = int(logits.argmax())
        assert grammar.accept(token)
        tokens.append(token)
    assert tokens[-1] in backend.stop_token_ids  # 最后一个是结束符，不算输出
    return tokenizer.decode(tokens[:-1]), len(tokens), allowed


smollm2 = default_model_path()
for name, path, vocab_size in [("SmolLM2", smollm2, json.loads((smollm2 / "config.json").read_text())["vocab_size"]),
                               ("Qwen3", qwen3_tokenizer_dir(), 151936)]:
    tokenizer = load_tokenizer(path)
    t0 = time.perf_counter()
    backend = GrammarBackend(tokenizer, vocab_size)
    t1 = time.perf_counter()
    backend.json_compiler  # json_schema 用的那份词表（去掉含控制字符的 token）：第一次用时才建，这里先建好，单独计时
    t2 = time.perf_counter()
    backend.compile("json_schema", json.dumps(SCHEMA))
    t3 = time.perf_counter()
    backend.compile("json_schema", json.dumps(SCHEMA))
    t4 = time.perf_counter()
    print(f"{name}：词表 {vocab_size} 个 token，掩码一行 {allocate_vocab_mask(1, vocab_size).shape[1]} 个 int32；"
          f"读分词器信息 {t1 - t0:.1f} s，建 JSON 用的词表 {t2 - t1:.1f} s，编译 schema {(t3 - t2) * 1e3:.0f} ms，"
          f"再要一次 {(t4 - t3) * 1e3:.2f} ms（缓存命中 {backend.hits} 次）")
    text, n, allowed = random_model(backend, tokenizer, "json_schema", json.dumps(SCHEMA), seed=0)
    jsonschema.validate(json.loads(text), SCHEMA)  # 不合 schema 就抛异常
    print(f"  json_schema → {text}  （{n} 个 token，通过校验）")
    print(f"    前 8 步允许的 token 数：{allowed[:8]}")
    text, n, _ = random_model(backend, tokenizer, "regex", PHONE, seed=1)
    print(f"  regex {PHONE} → {text}  （{n} 个 token，fullmatch: {re.fullmatch(PHONE, text) is not None}）")
    text, n, _ = random_model(backend, tokenizer, "ebnf", SQL, seed=2)
    print(f"  ebnf（一小段 SQL）→ {text}  （{n} 个 token）")

free = tokenizer.decode(torch.randn(12, len(tokenizer), generator=torch.Generator().manual_seed(0)).argmax(-1))
print(f"没有掩码，同一个随机模型的 12 个 token：{free!r}")
