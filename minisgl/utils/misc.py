# Tangled from book/chapters/ch01_skeleton.ipynb — edit the notebook, not this file.
def div_ceil(a: int, b: int) -> int:
    """向上取整的除法：放下 a 个 token 需要多少个大小为 b 的页。"""
    return (a + b - 1) // b


def div_even(a: int, b: int) -> int:
    """必须整除的除法，比如把 num_heads 个头平分给 b 个 rank。"""
    assert a % b == 0, f"{a} is not divisible by {b}"
    return a // b


def align_down(a: int, b: int) -> int:
    return a // b * b


def align_ceil(a: int, b: int) -> int:
    return div_ceil(a, b) * b
