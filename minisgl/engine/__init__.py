# Tangled from book/chapters/ch08_engine.ipynb — edit the notebook, not this file.
from .config import EngineConfig
from .engine import Engine, ForwardOutput
from .graph import GraphRunner, graph_batch_sizes
from .sample import BatchSamplingArgs, LogprobsOutput, Sampler

__all__ = ["BatchSamplingArgs", "Engine", "EngineConfig", "ForwardOutput", "GraphRunner", "LogprobsOutput",
           "Sampler", "graph_batch_sizes"]
