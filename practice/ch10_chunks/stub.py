def plan_chunks(requests, budget, decodes):
    """每一步 {uid: 这一步算的 token 数}，直到所有提示词算完。"""
    raise NotImplementedError
