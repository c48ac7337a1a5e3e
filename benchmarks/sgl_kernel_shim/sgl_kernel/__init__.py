"""Stand-ins, in plain PyTorch, for the two sgl_kernel ops that upstream mini-sglang's MoE imports.

sgl_kernel (SGLang's CUDA op library) is a large wheel that the offline GPU machine does not have, so
`benchmarks/bench_moe.py offline --engine upstream` puts this folder first on sys.path. Both ops keep sgl_kernel's
signatures and output layout and never synchronise with the host (upstream captures its MoE in CUDA graphs). They
take several PyTorch kernels where sgl_kernel takes one or two: at small batches this makes upstream's MoE layer
slower than with the real library, so the comparison leans in minisgl's favour there.
"""
from __future__ import annotations

import torch


def topk_softmax(topk_weights: torch.Tensor, topk_ids: torch.Tensor, gating_output: torch.Tensor,
                 renormalize: bool = False) -> None:
    """softmax over the experts, the top-k of it (renormalised when asked), written into the two outputs."""
    w, ids = torch.softmax(gating_output.float(), dim=-1).topk(topk_weights.shape[1], dim=-1)
    if renormalize:
        w = w / w.sum(dim=-1, keepdim=True)
    topk_weights.copy_(w)
    topk_ids.copy_(ids)


def moe_align_block_size(topk_ids: torch.Tensor, num_experts: int, block_size: int, sorted_ids: torch.Tensor,
                         expert_ids: torch.Tensor, num_tokens_post_pad: torch.Tensor, cumsum_buffer: torch.Tensor,
                         pad_sorted_token_ids: bool = True) -> None:
    """Pairs sorted by expert, each expert's run padded to a multiple of block_size.

    sorted_ids: pair indices (padding slots hold topk_ids.numel()); expert_ids: the expert of each block (-1 past
    the padded total); num_tokens_post_pad: the padded total. Ids outside [0, num_experts - 1) (upstream passes
    E + 1 and marks padded tokens -1) count as no expert.
    """
    flat = topk_ids.flatten().long()
    n, E = flat.numel(), num_experts - 1
    key = torch.where((flat >= 0) & (flat < E), flat, E)  # E: the bucket of pairs with no expert
    counts = torch.zeros(E + 1, dtype=torch.long, device=flat.device).scatter_add_(0, key, torch.ones_like(key))
    padded = (counts[:E] + block_size - 1) // block_size * block_size
    ends = padded.cumsum(0)
    order = torch.argsort(key, stable=True)  # pairs grouped by expert, by index within an expert
    first = counts.cumsum(0) - counts  # where each expert's pairs start in `order`
    sk = key[order]
    rank = torch.arange(n, device=flat.device) - first[sk]
    starts = torch.cat([ends - padded, ends.new_zeros(1)])
    dest = torch.where(sk < E, starts[sk] + rank, sorted_ids.numel() - 1)  # no-expert pairs: the last slot
    if pad_sorted_token_ids:
        sorted_ids.fill_(n)
    sorted_ids.scatter_(0, dest, torch.where(sk < E, order, n).to(sorted_ids.dtype))
    blocks = torch.arange(expert_ids.numel(), device=flat.device) * block_size
    owner = torch.searchsorted(ends, blocks, right=True)
    expert_ids.copy_(torch.where(owner < E, owner, -1))
    num_tokens_post_pad.copy_(ends[-1:])
    cumsum_buffer[:1].zero_()
    cumsum_buffer[1:E + 1].copy_(ends)


if __name__ == "__main__":  # a self-check on the CPU (CI runs it): the example in upstream's docstring, 0-based
    ids = torch.tensor([[2, 3, 4], [1, 2, 4], [1, 3, 4], [1, 2, 3]], dtype=torch.int32) - 1
    E, bs = 4, 4
    size = ids.numel() + (E + 1) * (bs - 1)
    sorted_ids, expert_ids = torch.empty(size, dtype=torch.int32), torch.empty(-(-size // bs), dtype=torch.int32)
    post_pad, cumsum = torch.empty(1, dtype=torch.int32), torch.empty(E + 2, dtype=torch.int32)
    moe_align_block_size(ids, E + 1, bs, sorted_ids, expert_ids, post_pad, cumsum)
    assert sorted_ids[:16].tolist() == [3, 6, 9, 12, 0, 4, 10, 12, 1, 7, 11, 12, 2, 5, 8, 12], sorted_ids
    assert expert_ids[:4].tolist() == [0, 1, 2, 3] and (expert_ids[4:] == -1).all() and post_pad.item() == 16
    logits = torch.tensor([[0.0, 2.0, 1.0, -1.0]])
    w, i = torch.empty(1, 2), torch.empty(1, 2, dtype=torch.int32)
    topk_softmax(w, i, logits, True)
    assert i.tolist() == [[1, 2]] and abs(w.sum().item() - 1) < 1e-6
    print("sgl_kernel shim: moe_align_block_size and topk_softmax match upstream's example")
