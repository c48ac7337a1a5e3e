# Tangled from book/chapters/ch02_layers.ipynb — edit the notebook, not this file.
from .activation import silu_and_mul
from .base import BaseOP, OPList, StateLessOP
from .embedding import ParallelLMHead, VocabParallelEmbedding
from .linear import LinearColParallelMerged, LinearQKVMerged, LinearReplicated, LinearRowParallel
from .norm import RMSNorm, RMSNormFused
from .rotary import RotaryEmbedding, get_rope

__all__ = [
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
