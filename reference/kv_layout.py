"""Where the block dimension is in a paged KV-cache tensor, and how to move whole blocks as bytes.

vLLM's layout depends on the platform: `[2, num_blocks, block_size, heads, head_dim]` on CUDA (K/V first),
`[num_blocks, kv_heads, block_size, 2*head_dim]` on CPU, `[num_blocks, block_size, head_size]` for MLA.
The block dimension is found from the tensor's shape and the number of blocks, never assumed.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence

import torch

from deferdump.reference.errors import LayoutError


def find_block_dim(tensor_shape: Sequence[int], num_blocks: int) -> int:
    """The dimension of `tensor_shape` that indexes blocks.

    The unique dimension of size `num_blocks`; when several match, the known vLLM layouts decide
    (a leading K/V dimension of 2 in a 5-D tensor means blocks are dimension 1, otherwise dimension 0).
    """
    shape = tuple(int(size) for size in tensor_shape)
    candidates = [dim for dim, size in enumerate(shape) if size == num_blocks]
    if not candidates:
        raise LayoutError(f"no dimension of shape {shape} has num_blocks={num_blocks}")
    if len(candidates) == 1:
        return candidates[0]
    preferred = [1] if len(shape) == 5 and shape[0] == 2 else []
    preferred.append(0)
    for dim in preferred:
        if dim in candidates:
            return dim
    raise LayoutError(f"block dimension of shape {shape} is ambiguous for num_blocks={num_blocks}: {candidates}")


def guess_num_blocks(tensor_shape: Sequence[int]) -> int:
    """num_blocks from a known vLLM layout, for callers that were not told it."""
    shape = tuple(int(size) for size in tensor_shape)
    if len(shape) == 5 and shape[0] == 2:
        return shape[1]
    if not shape:
        raise LayoutError("a KV-cache tensor must have at least one dimension")
    return shape[0]


@dataclasses.dataclass(frozen=True)
class LayerLayout:
    """One layer's KV tensor layout: which dimension holds blocks and how many bytes one block spans."""

    name: str
    index: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    block_dim: int
    block_nbytes: int

    @property
    def block_shape(self) -> tuple[int, ...]:
        """The shape of one block once the block dimension is moved to the front."""
        return tuple(size for dim, size in enumerate(self.shape) if dim != self.block_dim)

    def gather(self, tensor: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """Blocks `index` as a contiguous uint8 tensor [n, block_nbytes] (one batched index_select)."""
        blocks = tensor.index_select(self.block_dim, index).movedim(self.block_dim, 0).contiguous()
        return blocks.view(torch.uint8).reshape(index.numel(), self.block_nbytes)

    def gather_into(self, tensor: torch.Tensor, index: torch.Tensor, out: torch.Tensor) -> None:
        """Write blocks `index` into `out` (uint8 [n, block_nbytes], may be a column slice of a wider payload).

        One copy per byte: `index_select` writes straight into `out` instead of into a temporary that is
        then copied again (the dump path's copies are its cost on a CPU). Same bytes as `gather`.
        """
        n = index.numel()
        if tuple(out.shape) != (n, self.block_nbytes) or out.dtype != torch.uint8:
            raise LayoutError(
                f"layer {self.name}: expected uint8 [{n}, {self.block_nbytes}] out, got {out.dtype} {tuple(out.shape)}"
            )
        if not tensor.is_contiguous() or tensor.device != out.device:
            out.copy_(self.gather(tensor, index))
            return
        outer = 1
        for size in self.shape[: self.block_dim]:
            outer *= size
        as_bytes = tensor.view(torch.uint8).reshape(outer, self.shape[self.block_dim], -1)
        rows = out.view(n, outer, as_bytes.shape[2])  # the block's bytes, grouped by the dimensions before it
        as_words, rows = _as_words(as_bytes), _as_words(rows)
        if as_words is not None and rows is not None:
            as_bytes = as_words
        else:
            rows = out.view(n, outer, as_bytes.shape[2])
        for part in range(outer):
            torch.index_select(as_bytes[part], 0, index, out=rows[:, part, :])

    def scatter(self, tensor: torch.Tensor, index: torch.Tensor, data: torch.Tensor) -> None:
        """Write uint8 rows [n, block_nbytes] into blocks `index` (one batched index_copy_)."""
        n = index.numel()
        if tuple(data.shape) != (n, self.block_nbytes) or data.dtype != torch.uint8:
            raise LayoutError(
                f"layer {self.name}: expected uint8 [{n}, {self.block_nbytes}], got {data.dtype} {tuple(data.shape)}"
            )
        blocks = data.contiguous().view(self.dtype).reshape((n, *self.block_shape))
        tensor.index_copy_(self.block_dim, index, blocks.movedim(0, self.block_dim))


@dataclasses.dataclass(frozen=True)
class KVCacheLayout:
    """All layers, in registration order; one block's bytes are the layers' slices concatenated."""

    layers: tuple[LayerLayout, ...]
    num_blocks: int

    @functools.cached_property
    def block_nbytes(self) -> int:
        """Bytes of one block over every layer (cached: every dump asks, and the layers never change)."""
        return sum(layer.block_nbytes for layer in self.layers)

    def row_nbytes(self, layer_names: Sequence[str] | None) -> int:
        """Bytes of one block over the named layers (all when `layer_names` is None)."""
        if layer_names is None:
            return self.block_nbytes
        return sum(layer.block_nbytes for layer in self.select(layer_names))

    def layer(self, name: str) -> LayerLayout:
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise LayoutError(f"unknown layer {name!r}")

    def select(self, layer_names: Sequence[str] | None) -> tuple[LayerLayout, ...]:
        """The named layers in registration order (all when `layer_names` is None)."""
        if layer_names is None:
            return self.layers
        return tuple(self.layer(name) for name in layer_names)


def describe_kv_caches(kv_caches: Mapping[str, torch.Tensor], num_blocks: int | None = None) -> KVCacheLayout:
    """The layout of every layer; all layers must agree on num_blocks."""
    if not kv_caches:
        raise LayoutError("no KV-cache tensors were registered")
    first = next(iter(kv_caches.values()))
    blocks = num_blocks if num_blocks is not None else guess_num_blocks(first.shape)
    layers = []
    for index, (name, tensor) in enumerate(kv_caches.items()):
        block_dim = find_block_dim(tensor.shape, blocks)
        nbytes = tensor.numel() * tensor.element_size() // blocks
        layers.append(LayerLayout(name, index, tuple(tensor.shape), tensor.dtype, block_dim, nbytes))
    return KVCacheLayout(tuple(layers), blocks)


def _as_words(tensor: torch.Tensor) -> torch.Tensor | None:
    """The same bytes as int64 words when size, strides and address allow, else None: index_select's
    strided-output path copies element by element, and 8-byte elements make it ~10 % faster per byte."""
    if tensor.shape[-1] % 8 or tensor.stride(-1) != 1 or tensor.data_ptr() % 8:
        return None
    if any(stride % 8 for stride in tensor.stride()[:-1]):
        return None
    return tensor.view(torch.int64)
