"""The scribble adversary's write: fill whole blocks of paged KV tensors with a constant.

A connector that still reads a block vLLM has handed to another request then stores (or reports) the
constant instead of the KV it meant to save, and the output oracle sees the difference.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from deferdump.reference.kv_layout import find_block_dim

# Large enough that attention over a scribbled block is far from any real value, small enough to stay
# finite in bf16/fp16.
SCRIBBLE_VALUE = 7.0


def scribble_blocks(kv_caches: Sequence[torch.Tensor], num_blocks: int, block_ids: Sequence[int],
                    value: float = SCRIBBLE_VALUE) -> None:
    """Set every element of `block_ids` in every tensor (block dimension found from `num_blocks`)."""
    if not block_ids:
        return
    seen: set[int] = set()
    for tensor in kv_caches:
        if tensor.data_ptr() in seen:  # layers of different KV-cache groups may share one tensor
            continue
        seen.add(tensor.data_ptr())
        index = torch.tensor(list(block_ids), dtype=torch.long, device=tensor.device)
        tensor.index_fill_(find_block_dim(tensor.shape, num_blocks), index, value)
