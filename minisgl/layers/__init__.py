# Tangled from book/chapters/ch06_kvcache.ipynb — edit the notebook, not this file.
from .activation import silu_and_mul
from .attention import AttentionLayer
from .base import BaseOP, OPList, StateLessOP
from .embedding import ParallelLMHead, VocabParallelEmbedding
from .linear import LinearColParallelMerged, LinearQKVMerged, LinearReplicated, LinearRowParallel
from .norm import RMSNorm, RMSNormFused
from .rotary import RotaryEmbedding, get_rope

__all__ = [
    "AttentionLayer",
    "BaseOP",
    "StateLessOP",
    "OPList",
    "LinearReplicated",
    "LinearColParallelMerged",
    "LinearQKVMerged",
    "LinearRowParallel",
    "VocabParallelEmbedding",
    "ParallelLMHead",
    "RMSNorm",
    "RMSNormFused",
    "RotaryEmbedding",
    "get_rope",
    "silu_and_mul",
]
