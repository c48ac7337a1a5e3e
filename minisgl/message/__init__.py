# Tangled from book/chapters/ch12_message_zmq.ipynb — edit the notebook, not this file.
from .backend import AbortBackendMsg, BaseBackendMsg, BatchBackendMsg, ExitMsg, UserMsg
from .frontend import BaseFrontendMsg, BatchFrontendMsg, SchedulerStats, UserReply
from .tokenizer import AbortMsg, BaseTokenizerMsg, BatchTokenizerMsg, DetokenizeInfoMsg, DetokenizeMsg, TokenizeMsg
from .utils import decode, deserialize_type, encode, message_types, serialize_type

__all__ = [
    "AbortBackendMsg", "AbortMsg", "BaseBackendMsg", "BaseFrontendMsg", "BaseTokenizerMsg", "BatchBackendMsg",
    "BatchFrontendMsg", "BatchTokenizerMsg", "DetokenizeInfoMsg", "DetokenizeMsg", "ExitMsg", "SchedulerStats",
    "TokenizeMsg", "UserMsg", "UserReply", "decode", "deserialize_type", "encode", "message_types", "serialize_type",
]
