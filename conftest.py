"""Repository-level pytest hooks (hand-written, not tangled): how notebook cells are collected by nbval.

Cells tagged `gpu` need CUDA: on a machine without it they are skipped, as `tools/steps.py execute` skips them.
"""
import pytest


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="cell tagged gpu: needs CUDA")
    for item in items:
        cell = getattr(item, "cell", None)
        if cell is not None and "gpu" in cell.get("metadata", {}).get("tags", []):
            item.add_marker(skip)
