"""第 11 章练习：重叠调度的循环，延迟释放与中止。

把下面的 `raise NotImplementedError(...)` 换成你的实现。要求见同目录的 README.md。
可以自由添加辅助函数；`simulate` 的名字和参数不能改。
"""


def simulate(requests, aborts):
    """返回 (outputs, released)。"""
    raise NotImplementedError("实现 simulate")
