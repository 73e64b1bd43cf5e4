"""The step's "forward": a real compute kernel of configurable cost that writes the new tokens' KV slots.

Per layer it runs `matmuls_per_layer` dense matmuls (+tanh) over the step's tokens — the cost knob — then
writes each scheduled token's K and V into its (block, offset) slot of that layer's real KV tensor, in
vLLM's layout for the device (CUDA `[2, num_blocks, block_size, kv_heads, head_dim]`, CPU
`[num_blocks, kv_heads, block_size, 2*head_dim]`). The values come from the hidden state, so a block
rewritten by a later step holds different bytes: a dump that read it too late stores the wrong data and
`verify_dumps` sees it.

A hybrid model (`groups=2`: a full-attention and a sliding-window KV-cache group) alternates its layers
between the groups (even layers full attention, odd layers sliding window) and, as vLLM's hybrid
allocator does, layer `2j` and layer `2j + 1` share one KV tensor: a block id addresses the same memory
in both groups, and the pool hands each block to one group at a time. Each layer writes its tokens into
its own group's block table.

With `content="tokens"` every element of a token's slot holds `slot_value(token, position, owner, layer)`
instead (float32, exact): the bytes a block must hold are then known from the request's tokens alone, so
a checker can compare what a dump stored or a load restored with what the block held (property tests).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch

from deferdump.reference.groups import NULL_BLOCK

from deferdump.tools.engine.scheduler import ScheduledChunk

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
CONTENTS = ("hidden", "tokens")


def slot_value(token: int, position: int, owner: int, layer_index: int) -> int:
    """A token's slot value in "tokens" content: distinct per (token < 50, position < 64, owner < 4, layer
    < 4), and below 2**24, so float32 holds it exactly."""
    return ((token * 64 + position) * 4 + owner) * 4 + layer_index + 1


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """KV-cache geometry and the forward's compute cost."""

    layers: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    block_size: int = 16
    dtype: str = "bfloat16"
    hidden_dim: int = 256
    matmuls_per_layer: int = 2
    content: str = "hidden"  # hidden: KV from the hidden state; tokens: `slot_value` of each token

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}, got {self.dtype!r}")
        if self.content not in CONTENTS:
            raise ValueError(f"content must be one of {', '.join(CONTENTS)}, got {self.content!r}")
        if self.content == "tokens" and self.dtype != "float32":
            raise ValueError("content 'tokens' needs dtype float32 (its slot values are exact there)")
        for name in ("layers", "kv_heads", "head_dim", "block_size", "hidden_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.matmuls_per_layer < 0:
            raise ValueError("matmuls_per_layer must be >= 0")

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    @property
    def layer_block_nbytes(self) -> int:
        """Bytes of one block in one layer (K and V)."""
        return 2 * self.kv_heads * self.head_dim * self.block_size * self.torch_dtype.itemsize

    @property
    def block_nbytes(self) -> int:
        """Bytes of one block across all layers: what one dumped block costs."""
        return self.layers * self.layer_block_nbytes

    def layer_names(self) -> list[str]:
        return [f"model.layers.{i}.self_attn" for i in range(self.layers)]


def make_kv_caches(shape: ModelShape, num_blocks: int, device: torch.device, groups: int = 1) -> dict[str, torch.Tensor]:
    """Zeroed KV tensors in vLLM's layout for `device` (touched, so page faults stay out of the timings).

    With `groups` KV-cache groups, layer `i` belongs to group `i % groups` and the `groups` consecutive
    layers `groups*j .. groups*j + groups - 1` share one tensor (vLLM's `KVCacheTensor.shared_by`)."""
    if shape.layers % groups:
        raise ValueError(f"{shape.layers} layers cannot be split evenly over {groups} KV-cache groups")
    caches: dict[str, torch.Tensor] = {}
    for index, name in enumerate(shape.layer_names()):
        if index % groups:
            caches[name] = caches[shape.layer_names()[index - index % groups]]
            continue
        if device.type == "cuda":
            size = (2, num_blocks, shape.block_size, shape.kv_heads, shape.head_dim)
        else:
            size = (num_blocks, shape.kv_heads, shape.block_size, 2 * shape.head_dim)
        caches[name] = torch.zeros(size, dtype=shape.torch_dtype, device=device)
    return caches


def group_layer_names(shape: ModelShape, groups: int) -> list[tuple[str, ...]]:
    """The layer names of each KV-cache group (group `g`: layers `g, g + groups, ...`)."""
    names = shape.layer_names()
    return [tuple(names[g::groups]) for g in range(groups)]


@dataclasses.dataclass(frozen=True)
class SlotBatch:
    """The step's tokens as KV slots: block and in-block offset of each, plus every block written."""

    block_index: torch.Tensor
    offset_index: torch.Tensor
    num_tokens: int
    written_blocks: frozenset[int]  # every group's
    token_codes: torch.Tensor | None = None  # "tokens" content: token * 64 + position per slot
    sw_block_index: torch.Tensor | None = None  # hybrid: each slot's block in the sliding-window group


class ForwardPass:
    """Weights, the running hidden state and one rank's KV tensors."""

    def __init__(
        self, shape: ModelShape, num_blocks: int, device: torch.device, *, seed: int = 0, max_tokens: int = 8192,
        owner: int = 0, groups: int = 1,
    ) -> None:
        """`owner`: whose KV this rank holds in "tokens" content (its rank; 0 on every rank for MLA).
        `groups`: 2 for a hybrid model (full attention + sliding window)."""
        self.shape = shape
        self.owner = owner
        self.device = device
        self.groups = groups
        self.kv_caches = make_kv_caches(shape, num_blocks, device, groups)
        self._names = list(self.kv_caches)
        generator = torch.Generator().manual_seed(seed)
        scale = 1.0 / math.sqrt(shape.hidden_dim)
        self._weights = [
            [(torch.randn(shape.hidden_dim, shape.hidden_dim, generator=generator) * scale).to(device)
             for _ in range(shape.matmuls_per_layer)]
            for _ in range(shape.layers)
        ]
        self._tokens = torch.randn(max_tokens, shape.hidden_dim, generator=generator).to(device)
        self._kv_width = 2 * shape.kv_heads * shape.head_dim
        self._repeats = -(-self._kv_width // shape.hidden_dim)
        self._step = 0
        self._hidden: torch.Tensor | None = None

    @property
    def layer_names(self) -> list[str]:
        return self._names

    def slots(self, chunks: Sequence[ScheduledChunk]) -> SlotBatch:
        """Where each scheduled token's KV goes."""
        block_size = self.shape.block_size
        blocks: list[int] = []
        sw_blocks: list[int] = []
        offsets: list[int] = []
        codes: list[int] = []
        by_tokens = self.shape.content == "tokens"
        hybrid = self.groups > 1
        for chunk in chunks:
            ids = chunk.block_ids
            for position in range(chunk.start, chunk.start + chunk.num_tokens):
                blocks.append(ids[position // block_size])
                if hybrid:
                    sw_block = chunk.sw_block_ids[position // block_size]
                    if sw_block == NULL_BLOCK:
                        raise RuntimeError(f"{chunk.req_id}: position {position} has no sliding-window block")
                    sw_blocks.append(sw_block)
                offsets.append(position % block_size)
                if by_tokens:
                    codes.append(chunk.tokens[position - chunk.start] * 64 + position)
        return SlotBatch(
            torch.tensor(blocks, dtype=torch.long, device=self.device),
            torch.tensor(offsets, dtype=torch.long, device=self.device),
            len(blocks),
            frozenset(blocks) | frozenset(sw_blocks),
            torch.tensor(codes, dtype=torch.float32, device=self.device) if by_tokens else None,
            torch.tensor(sw_blocks, dtype=torch.long, device=self.device) if hybrid else None,
        )

    def begin(self, batch: SlotBatch) -> None:
        """Start a step: the hidden state of its tokens (rotated each step so KV bytes differ per step)."""
        self._step += 1
        count = batch.num_tokens
        rows = self._tokens.shape[0]
        start = (self._step * 7919) % rows
        index = torch.arange(start, start + count, device=self.device) % rows
        self._hidden = self._tokens.index_select(0, index)

    def layer(self, index: int, batch: SlotBatch) -> None:
        """Compute layer `index` and write its K/V for every scheduled token."""
        if self._hidden is None:
            raise RuntimeError("ForwardPass.layer called before begin()")
        hidden = self._hidden
        for weight in self._weights[index]:
            hidden = torch.tanh(hidden @ weight)
        self._hidden = hidden
        if batch.num_tokens == 0:
            return
        if batch.token_codes is not None:
            codes = (batch.token_codes * 4 + self.owner) * 4 + (index + 1)
            values = codes.unsqueeze(1).expand(batch.num_tokens, self._kv_width).contiguous()
        else:
            values = hidden.repeat(1, self._repeats)[:, : self._kv_width].to(self.shape.torch_dtype)
        kv = self.kv_caches[self._names[index]]
        shape = self.shape
        block_index = batch.block_index
        if index % self.groups:  # a sliding-window layer writes its group's blocks
            assert batch.sw_block_index is not None
            block_index = batch.sw_block_index
        if self.device.type == "cuda":
            kv[:, block_index, batch.offset_index] = values.view(
                batch.num_tokens, 2, shape.kv_heads, shape.head_dim
            ).transpose(0, 1)
        else:
            kv[block_index, :, batch.offset_index] = values.view(batch.num_tokens, shape.kv_heads, 2 * shape.head_dim)

    def finish(self) -> None:
        """End the step; on CUDA wait for the compute stream (vLLM syncs at sampling)."""
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
