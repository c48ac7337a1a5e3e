def simulate(requests, aborts):
    """返回 (outputs, released)。"""
    raise NotImplementedError
