"""第 1 章练习：带类型的环境变量。

把下面每个 `raise NotImplementedError(...)` 换成你的实现。要求见同目录的 README.md。
"""
from __future__ import annotations

from typing import Mapping

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")
# 字节数后缀：按 1024 进位
SIZE_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def parse_bool(raw: str) -> bool:
    """"1/true/yes/on" → True，"0/false/no/off" → False；不区分大小写，忽略首尾空白。

    其它任何字符串 → ValueError。
    """
    raise NotImplementedError("实现 parse_bool")


def parse_size(raw: str) -> int:
    """字节数："1G" → 1073741824，"512M"、"64k"、"1.5G"、"2GiB"、"100MB"、"4096" 都要认识。

    数字（可以带小数）+ 可选单位 K/M/G/T（不区分大小写）+ 可选的 "B" 或 "iB"；忽略首尾空白。
    结果取整（向下）为 int。负数、空串、不认识的单位 → ValueError。
    """
    raise NotImplementedError("实现 parse_size")


def read_env(environ: Mapping[str, str], name: str, kind: str, default):
    """从 environ 里读变量 name，按 kind（"bool" / "int" / "float" / "size"）转换。

    - 变量不存在，或者值去掉空白后是空串 → 返回 default（原样，不做转换）。
    - 值不合法 → ValueError，信息里要有变量名和原始值，例如
      "MINISGL_PAGE_SIZE='abc' is not a valid int"。
    - kind 不认识 → ValueError（信息里有这个 kind）。
    """
    raise NotImplementedError("实现 read_env")
