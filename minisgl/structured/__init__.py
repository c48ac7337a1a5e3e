# Tangled from book/chapters/ch17_structured.ipynb — edit the notebook, not this file.
from .grammar import GRAMMAR_KINDS, JSON_OBJECT_SCHEMA, Grammar, GrammarBackend, check_grammar, fill_vocab_mask
from .mask import allocate_vocab_mask, apply_vocab_mask, unpack_vocab_mask

__all__ = [
    "GRAMMAR_KINDS", "JSON_OBJECT_SCHEMA", "Grammar", "GrammarBackend", "allocate_vocab_mask", "apply_vocab_mask",
    "check_grammar", "fill_vocab_mask", "unpack_vocab_mask",
]
