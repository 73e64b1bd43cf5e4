"""Stub vLLM and store modules, so a connector module imports and runs without vLLM, a GPU or a native store.

The stub ``KVConnectorBase_V1`` keeps vLLM 0.32's defaults (``distributed/kv_transfer/kv_connector/v1/
base.py``: metadata binding ~243-284, ``request_finished`` -> ``(False, None)`` ~616-636, ``get_finished``
-> ``(None, None)`` ~383-399, ``get_transfer_results`` wrapping it ~401-409, no-op ``handle_preemptions``/``wait_for_save``/``save_kv_layer``) and its
abstract methods; the scheduler-output classes carry 0.32's field names (``v1/core/sched/output.py``).
``torch.cuda``'s events and streams get CPU stand-ins where CUDA is absent (``cuda_standin.py``).
Any other ``vllm.*`` name imports as a placeholder that raises :class:`StubMissing` when used, so a run
that needs real vLLM machinery stops with that name instead of guessing. Store modules named by the
caller hand out the replay's :class:`~.store.RecordingStore` for every attribute.
"""
from __future__ import annotations

import enum
import importlib.abc
import importlib.machinery
import logging
import sys
import types
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from deferdump.reference.errors import DeferDumpError
from deferdump.tools.mro.run.block_pool import BlockPool, KVCacheManager
from deferdump.tools.mro.run.cuda_standin import cuda_standins
from deferdump.tools.mro.run.store import RecordingStore, store_factory

__all__ = ["StubMissing", "stub_modules"]

BASE_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.base"


class StubMissing(DeferDumpError):
    """The connector used a vLLM name the stubs do not provide."""


# ---- vLLM 0.32's connector base, as far as a replay needs it ------------------------------------------
class KVConnectorRole(enum.Enum):
    SCHEDULER = 0
    WORKER = 1


class KVConnectorMetadata(ABC):  # noqa: B024 - as in vLLM
    """Per-step metadata from the scheduler-side connector to the worker side."""


class KVConnectorWorkerMetadata(ABC):  # noqa: B024
    pass


@dataclass
class KVConnectorTransferResults:
    """vLLM 0.32's base.py ~88-97: one worker's completed sends and receives."""

    finished_sending: set[str] = field(default_factory=set)
    finished_recving: set[str] = field(default_factory=set)
    failed_recving: set[str] = field(default_factory=set)


class SupportsHMA(ABC):
    @abstractmethod
    def request_finished_all_groups(self, request: Any, block_ids: tuple[list[int], ...]) -> tuple[bool, Any]:
        raise NotImplementedError  # abstract, as in vLLM (base.py ~107-130): a SupportsHMA class defines it


def supports_hma(connector: Any) -> bool:
    return issubclass(connector, SupportsHMA) if isinstance(connector, type) else isinstance(connector, SupportsHMA)


class KVConnectorBase_V1(ABC):  # noqa: N801 - vLLM's name
    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None) -> None:
        self._connector_metadata: KVConnectorMetadata | None = None
        self._vllm_config = vllm_config
        self._kv_transfer_config = getattr(vllm_config, "kv_transfer_config", None)
        self._kv_cache_config = kv_cache_config
        self._kv_cache_manager = None
        self._role = role

    @property
    def role(self) -> KVConnectorRole:
        return self._role

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        self._connector_metadata = connector_metadata

    def clear_connector_metadata(self) -> None:
        self._connector_metadata = None

    def _get_connector_metadata(self) -> KVConnectorMetadata:
        assert self._connector_metadata is not None
        return self._connector_metadata

    def has_connector_metadata(self) -> bool:
        return self._connector_metadata is not None

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        return

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        return

    @abstractmethod
    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None: ...

    @abstractmethod
    def wait_for_layer_load(self, layer_name: str) -> None: ...

    @abstractmethod
    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None: ...

    @abstractmethod
    def wait_for_save(self) -> None: ...

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        return None, None

    def get_transfer_results(self, finished_req_ids: set[str]) -> "KVConnectorTransferResults":
        """What vLLM's runners call (kv_connector_model_runner_mixin.py:94); base.py:401-409 wraps get_finished."""
        finished_sending, finished_recving = self.get_finished(finished_req_ids)
        return KVConnectorTransferResults(finished_sending=set(finished_sending or ()),
                                          finished_recving=set(finished_recving or ()))

    def get_block_ids_with_load_errors(self) -> set[int]:
        return set()

    def get_finished_count(self) -> int | None:
        """None: vLLM's KVOutputAggregator then waits for every rank's report (kv_connector/utils.py ~76-77)."""
        return None

    def shutdown(self) -> None:
        return None

    def get_kv_connector_stats(self) -> Any:
        """base.py ~438-440; vLLM asks both roles each step (kv_connector_model_runner_mixin.py ~102,
        scheduler.py ~2342)."""
        return None

    def get_kv_connector_kv_cache_events(self) -> Any:
        return None  # base.py ~442-447; the worker's, each step (kv_connector_model_runner_mixin.py ~103)

    def take_events(self) -> Any:
        return ()  # base.py ~650-657; the scheduler's, each step after the stats (scheduler.py ~2375)

    def reset_cache(self) -> bool | None:
        return None

    @abstractmethod
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]: ...

    @abstractmethod
    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None: ...

    @abstractmethod
    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata: ...

    def update_connector_output(self, connector_output: Any) -> None:
        return

    def bind_kv_cache_manager(self, kv_cache_manager: Any) -> None:
        """base.py ~474-478: vLLM's scheduler binds its KV-cache manager once it is built (scheduler.py ~358-360)."""
        self._kv_cache_manager = kv_cache_manager
        self.bind_gpu_block_pool(kv_cache_manager.block_pool)

    def bind_gpu_block_pool(self, gpu_block_pool: Any) -> None:
        return

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        return None

    def has_pending_block_frees(self) -> bool:
        return False

    def has_pending_push_work(self) -> bool:
        return False  # base.py ~663-673 (the request counts it falls back on are the engine's, never the class's)

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, Any]:
        return False, None


# ---- the scheduler's output (vLLM 0.32 field names) --------------------------------------------------
@dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: list[int] | None
    block_ids: tuple[list[int], ...]
    num_computed_tokens: int
    mm_features: list[Any] = field(default_factory=list)
    sampling_params: Any = None
    pooling_params: Any = None
    lora_request: Any = None


@dataclass
class CachedRequestData:
    req_ids: list[str]
    resumed_req_ids: set[str]
    new_token_ids: list[list[int]]
    all_token_ids: dict[str, list[int]]
    new_block_ids: list[tuple[list[int], ...] | None]
    num_computed_tokens: list[int]
    num_output_tokens: list[int]

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)


@dataclass
class KVConnectorBlockState:
    req_ids: set[str]
    resolve_block_ids: Callable[[str], tuple[list[int], ...]]
    boundary_state_offloads: dict[str, list[tuple[int, int, int]]] = field(default_factory=dict)

    def get_block_ids(self, req_id: str) -> tuple[list[int], ...] | None:
        return self.resolve_block_ids(req_id) if req_id in self.req_ids else None


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    finished_req_ids: set[str]
    preempted_req_ids: set[str] | None = None
    kv_connector_metadata: Any = None
    kv_connector_block_state: KVConnectorBlockState | None = None
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)
    scheduled_encoder_inputs: dict[str, list[int]] = field(default_factory=dict)
    free_encoder_mm_hashes: list[str] = field(default_factory=list)


class _Partial:
    """A vLLM object (a config, the request) as far as the stubs know it. Real vLLM's have many more attributes:
    reading one the stub lacks stops the run (:class:`StubMissing`) rather than driving the class on a guessed
    value, or reading as the class's own crash."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise StubMissing(f"the connector read {type(self).__name__}.{name}, which the stub vLLM does not provide")


class RequestStatus(enum.IntEnum):
    """vLLM 0.32's request states (v1/request.py ~370-393), in its order: after ``PREEMPTED`` is finished."""

    WAITING = enum.auto()
    WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR = enum.auto()
    WAITING_FOR_REMOTE_KVS = enum.auto()
    WAITING_FOR_STREAMING_REQ = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_IGNORED = enum.auto()
    FINISHED_ERROR = enum.auto()
    FINISHED_REPETITION = enum.auto()

    def __str__(self) -> str:
        return self.name

    @staticmethod
    def is_finished(status: "RequestStatus") -> bool:
        return status > RequestStatus.PREEMPTED


@dataclass
class Request(_Partial):
    """The fields of vLLM's ``Request`` a connector reads when a request finishes. ``status`` is what vLLM has
    set by then: ``FINISHED_ABORTED`` for an abort (``Scheduler.finish_requests``), ``FINISHED_STOPPED`` for a
    request that ended by itself (``update_from_output``)."""

    request_id: str
    prompt_token_ids: list[int]
    num_computed_tokens: int = 0
    kv_transfer_params: dict[str, Any] | None = None
    status: RequestStatus = RequestStatus.RUNNING
    priority: int = 0
    output_token_ids: list[int] = field(default_factory=list)  # the replay's steps compute prompt blocks only
    sampling_params: "SamplingParams | None" = field(default_factory=lambda: SamplingParams())

    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        return self.num_tokens

    @property
    def block_hashes(self) -> list[bytes]:
        """One hash per full block of the prompt (vLLM's prefix-cache keys; distinct per request here)."""
        full = len(self.prompt_token_ids) // BLOCK_SIZE
        return [f"{self.request_id}:{i}".encode() for i in range(full)]

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids)


@dataclass
class SamplingParams(_Partial):
    """A request's sampling parameters as far as a connector reads them: ``extra_args`` (None: the replay's
    requests ask for nothing of a connector there). The rest (``max_tokens``, stop conditions) is the replay's
    schedule, never guessed."""

    extra_args: dict[str, Any] | None = None


@dataclass
class KVTransferConfig(_Partial):
    kv_connector: str = "replayed"
    engine_id: str = "replayed-engine"  # vLLM fills a uuid in when none is configured (config/kv_transfer.py ~111)
    kv_role: str = "kv_both"
    kv_port: int = 14579  # vLLM's default (config/kv_transfer.py ~75)
    kv_connector_extra_config: dict[str, Any] = field(default_factory=dict)
    kv_connector_module_path: str | None = None
    enable_permute_local_kv: bool = False
    kv_load_failure_policy: str = "fail"

    @property
    def is_kv_producer(self) -> bool:
        return True

    @property
    def is_kv_consumer(self) -> bool:
        return True

    def get_from_extra_config(self, key: str, default: Any) -> Any:
        return self.kv_connector_extra_config.get(key, default)


BLOCK_SIZE = 16
"""Tokens per KV-cache block in every replay: the replay schedules one block (16 tokens) per request a step."""


@dataclass
class CacheConfig(_Partial):
    block_size: int = BLOCK_SIZE
    enable_prefix_caching: bool = True


@dataclass
class ParallelConfig(_Partial):
    """One worker, or (an MLA case) two tensor-parallel ranks, each worker built with its own ``rank``."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    rank: int = 0
    world_size: int = 1
    decode_context_parallel_size: int = 1
    prefill_context_parallel_size: int = 1


@dataclass
class HfTextConfig(_Partial):
    """The Hugging Face text config, as far as the replay's model has one: its sliding window (or none)."""

    sliding_window: int | None = None
    num_hidden_layers: int = 1


@dataclass
class ModelConfig(_Partial):
    model: str = "replayed"
    max_model_len: int = 4096
    use_mla: bool = False  # a property of vLLM's ModelConfig
    hf_text_config: "HfTextConfig" = field(default_factory=lambda: HfTextConfig())
    hf_config: "HfTextConfig | None" = None  # a text model's HF config is its text config

    def __post_init__(self) -> None:
        if self.hf_config is None:
            self.hf_config = self.hf_text_config

    def get_sliding_window(self) -> int | None:
        """As vLLM's (config/model.py ~1612-1614): the HF text config's window, if any."""
        return self.hf_text_config.sliding_window

    def get_total_num_hidden_layers(self) -> int:
        """The model's attention layers: the replay's layout names one layer per hidden layer (config/model.py
        ~1692-1693)."""
        return self.hf_text_config.num_hidden_layers

    def get_num_layers(self, parallel_config: Any) -> int:
        """One pipeline stage holds every layer (config/model.py ~1710-1712; the replay has no pipeline
        parallelism)."""
        return self.get_total_num_hidden_layers()


@dataclass
class SchedulerConfig(_Partial):
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 16


@dataclass
class VllmConfig(_Partial):
    kv_transfer_config: KVTransferConfig = field(default_factory=KVTransferConfig)
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    model_config: ModelConfig = field(default_factory=ModelConfig)
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)


# ---- the KV-cache layout (vLLM 0.32's v1/kv_cache_interface.py), handed to both roles' constructors ----------
@dataclass
class KVCacheSpec:
    block_size: int


@dataclass
class AttentionSpec(KVCacheSpec):
    num_kv_heads: int = 1
    head_size: int = 8


@dataclass
class FullAttentionSpec(AttentionSpec):
    sliding_window: int | None = None
    attention_chunk_size: int | None = None


class MLAAttentionSpec(FullAttentionSpec):
    """The one group of an MLA case's layout."""


@dataclass
class SlidingWindowSpec(AttentionSpec):
    sliding_window: int = BLOCK_SIZE


class ChunkedLocalAttentionSpec(AttentionSpec):
    """Never handed out; for ``isinstance`` tests."""


class MambaSpec(KVCacheSpec):
    """Never handed out; for ``isinstance`` tests."""


@dataclass
class KVCacheGroupSpec:
    layer_names: list[str]
    kv_cache_spec: KVCacheSpec


@dataclass
class KVCacheConfig:
    num_blocks: int
    kv_cache_tensors: list[Any]
    kv_cache_groups: list[KVCacheGroupSpec]


def kv_cache_config(groups: Sequence[str], layers: int, num_blocks: int) -> KVCacheConfig:
    """The layout of a replayed case: ``groups`` lists each KV-cache group's kind (``"full"``, ``"mla"`` or
    ``"sliding"``);
    each group has ``layers`` layers, named ``layer.<i>`` in order over the groups, as the replay's forward
    calls ``save_kv_layer``."""
    specs = {"full": lambda: FullAttentionSpec(block_size=BLOCK_SIZE),
             "mla": lambda: MLAAttentionSpec(block_size=BLOCK_SIZE),
             "sliding": lambda: SlidingWindowSpec(block_size=BLOCK_SIZE)}
    built, index = [], 0
    for kind in groups:
        names = [f"layer.{index + i}" for i in range(layers)]
        index += layers
        built.append(KVCacheGroupSpec(layer_names=names, kv_cache_spec=specs[kind]()))
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=built)


TENSOR_PARALLEL = {"rank": 0, "world_size": 1}
"""The rank whose worker the replay is calling now, and how many there are (set by the replay)."""


def get_tensor_model_parallel_rank() -> int:
    return TENSOR_PARALLEL["rank"]


def get_tensor_model_parallel_world_size() -> int:
    return TENSOR_PARALLEL["world_size"]


def vllm_config(rank: int = 0, world_size: int = 1, sliding_window: int | None = None,
                layers: int = 1) -> VllmConfig:
    """The config one role of one rank is built with: an MLA model (``use_mla``) when there are two ranks, a
    model with a sliding window (of one block) on the hybrid case, ``layers`` hidden layers (the layout's)."""
    text = HfTextConfig(sliding_window=sliding_window, num_hidden_layers=layers)
    return VllmConfig(parallel_config=ParallelConfig(tensor_parallel_size=world_size, rank=rank, world_size=world_size),
                      model_config=ModelConfig(use_mla=world_size > 1, hf_text_config=text))


@dataclass
class GroupCoordinator(_Partial):
    """A process group as a connector asks about it (distributed/parallel_state.py ~426-660): the ranks in it,
    the caller's place. The replay has tensor parallelism only (one or two ranks) and no pipeline stages."""

    rank: int
    ranks: list[int]
    local_rank: int

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def rank_in_group(self) -> int:
        return self.ranks.index(self.rank)

    @property
    def first_rank(self) -> int:
        return self.ranks[0]

    @property
    def last_rank(self) -> int:
        return self.ranks[-1]

    @property
    def is_first_rank(self) -> bool:
        return self.rank == self.first_rank

    @property
    def is_last_rank(self) -> bool:
        return self.rank == self.last_rank


def get_tp_group() -> GroupCoordinator:
    """The caller's tensor-parallel group: every rank of the replay."""
    rank = TENSOR_PARALLEL["rank"]
    return GroupCoordinator(rank=rank, ranks=list(range(TENSOR_PARALLEL["world_size"])), local_rank=rank)


def get_pp_group() -> GroupCoordinator:
    """The caller's pipeline-parallel group: one stage, the caller alone (vLLM groups ranks of one
    tensor-parallel index across stages)."""
    rank = TENSOR_PARALLEL["rank"]
    return GroupCoordinator(rank=rank, ranks=[rank], local_rank=rank)


def cdiv(a: int, b: int) -> int:
    """Ceiling division, as vllm/utils/math_utils.py ~12-14."""
    return -(a // -b)


def round_up(x: int, y: int) -> int:
    return ((x + y - 1) // y) * y


def round_down(x: int, y: int) -> int:
    return (x // y) * y


def extract_layer_index(layer_name: str, num_attn_module: int = 1) -> int:
    """A layer's index from its module name (model_executor/models/utils.py ~1010-1042): the replay's names are
    ``layer.<i>``. A name with no index, or more than the function allows, fails vLLM's assertion here too."""
    numbers = [int(part) for part in layer_name.split(".") if part.lstrip("-").isdigit()]
    if num_attn_module == 1 or "attn" not in layer_name:
        assert len(numbers) == 1, f"layer name {layer_name} should only contain one integer"
        return numbers[0]
    assert len(numbers) <= 2, f"layer name {layer_name} should contain most two integers"
    return numbers[0] * num_attn_module + numbers[1] if len(numbers) == 2 else numbers[0]


# ---- the KV events a connector publishes (vllm/distributed/kv_events.py, msgspec structs there) --------------
MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"
MEDIUM_STORAGE = "STORAGE"


class KVCacheEvent:
    """Base class of the event records."""

    def __hash__(self) -> int:
        return hash(tuple(tuple(v) if isinstance(v, list) else v for v in vars(self).values()))


@dataclass(eq=True)
class BlockStored(KVCacheEvent):
    block_hashes: list[Any]
    parent_block_hash: Any
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    __hash__ = KVCacheEvent.__hash__


@dataclass(eq=True)
class BlockRemoved(KVCacheEvent):
    block_hashes: list[Any]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None
    __hash__ = KVCacheEvent.__hash__


@dataclass(eq=True)
class AllBlocksCleared(KVCacheEvent):
    __hash__ = KVCacheEvent.__hash__


@dataclass
class KVEventBatch:
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVConnectorKVEvents(ABC):
    """The container a worker's ``get_kv_connector_kv_cache_events`` returns; vLLM merges the ranks' through
    these methods (kv_connector/utils.py ~160-170). They are abstract in vLLM (distributed/kv_events.py ~226-253), so
    here: a connector's subclass that leaves one out cannot be built, in the replay as in vLLM
    (tests/vllm/test_vllm_mro_stubs.py compares the abstract methods)."""

    @abstractmethod
    def add_events(self, events: list[KVCacheEvent]) -> None:
        raise NotImplementedError

    @abstractmethod
    def aggregate(self) -> "KVConnectorKVEvents":
        raise NotImplementedError

    @abstractmethod
    def increment_workers(self, count: int = 1) -> None:
        raise NotImplementedError

    @abstractmethod
    def get_all_events(self) -> list[KVCacheEvent]:
        raise NotImplementedError

    @abstractmethod
    def get_number_of_workers(self) -> int:
        raise NotImplementedError

    @abstractmethod
    def clear_events(self) -> None:
        raise NotImplementedError

    def merge(self, other: "KVConnectorKVEvents") -> "KVConnectorKVEvents":
        self.add_events(other.get_all_events())
        return self


@dataclass
class KVConnectorStats:
    """The metrics base class (kv_connector/v1/metrics.py ~19-50): a worker's stats travel to the engine core,
    where vLLM aggregates the ranks' and the scheduler-side instance's. ``reset``/``aggregate``/``reduce``/``is_empty``
    raise NotImplementedError as vLLM's base does: a connector's stats class must define those vLLM calls, and one
    that does not raises in the replay where it would in vLLM."""

    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return self.data

    def reset(self) -> None:
        raise NotImplementedError

    def aggregate(self, other: "KVConnectorStats") -> "KVConnectorStats":
        raise NotImplementedError

    def reduce(self) -> dict[str, int | float]:
        raise NotImplementedError

    def is_empty(self) -> bool:
        raise NotImplementedError


@dataclass
class KVConnectorOutput:
    """v1/outputs.py ~214-233, the fields a replay fills."""

    finished_sending: set[str] | None = None
    finished_recving: set[str] | None = None
    kv_connector_stats: Any = None
    kv_cache_events: Any = None
    kv_connector_worker_meta: Any = None
    invalid_block_ids: set[int] = field(default_factory=set)
    failed_recving: set[str] = field(default_factory=set)
    expected_finished_count: int = 0


def missing(what: str) -> StubMissing:
    return StubMissing(f"the connector used {what}, which the stub vLLM does not provide")


def kv_cache_manager(num_blocks: int, block_ids: Callable[[str], tuple[list[int], ...]]) -> KVCacheManager:
    """The scheduler's KV-cache manager with a pool of ``num_blocks`` blocks (block 0 the null block);
    ``block_ids`` answers ``get_block_ids(request_id)``."""
    return KVCacheManager(BlockPool(num_blocks, missing), block_ids)


# ---- the module tree -----------------------------------------------------------------------------------
class _Placeholder:
    """A vLLM name the stubs lack: importing it works, using it raises."""

    def __init__(self, qualname: str) -> None:
        self._qualname = qualname

    def __call__(self, *args: object, **kwargs: object) -> Any:
        raise missing(self._qualname)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(f"{self._qualname}.{name}")

    def __mro_entries__(self, bases: tuple[object, ...]) -> tuple[type, ...]:
        raise StubMissing(f"a class derives from {self._qualname}, which the stub vLLM does not provide")


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(f"{self.__name__}.{name}")


class _StoreModule(types.ModuleType):
    def __init__(self, name: str, store: RecordingStore) -> None:
        super().__init__(name)
        self.__path__: list[str] = []
        self._store = store

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _StoreFactoryClass(self._store, f"{self.__name__}.{name}")


class _StoreFactoryClass:
    """Any name in a stubbed store module: calling it, or any of its attributes, gives the recording store."""

    def __init__(self, store: RecordingStore, qualname: str) -> None:
        self._store = store
        self._qualname = qualname

    def __call__(self, *args: object, **kwargs: object) -> RecordingStore:
        return self._store

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return store_factory(self._store)


_CONTENTS: dict[str, dict[str, Any]] = {
    BASE_MODULE: {
        "KVConnectorBase_V1": KVConnectorBase_V1, "KVConnectorMetadata": KVConnectorMetadata,
        "KVConnectorRole": KVConnectorRole, "SupportsHMA": SupportsHMA, "supports_hma": supports_hma,
        "KVConnectorWorkerMetadata": KVConnectorWorkerMetadata,
        "KVConnectorTransferResults": KVConnectorTransferResults,
    },
    "vllm.logger": {"init_logger": logging.getLogger},
    "vllm.config": {"VllmConfig": VllmConfig, "KVTransferConfig": KVTransferConfig, "CacheConfig": CacheConfig,
                    "ParallelConfig": ParallelConfig, "ModelConfig": ModelConfig, "SchedulerConfig": SchedulerConfig},
    "vllm.v1.kv_cache_interface": {
        "KVCacheConfig": KVCacheConfig, "KVCacheGroupSpec": KVCacheGroupSpec, "KVCacheSpec": KVCacheSpec,
        "AttentionSpec": AttentionSpec, "FullAttentionSpec": FullAttentionSpec, "MLAAttentionSpec": MLAAttentionSpec,
        "SlidingWindowSpec": SlidingWindowSpec, "ChunkedLocalAttentionSpec": ChunkedLocalAttentionSpec,
        "MambaSpec": MambaSpec,
    },
    "vllm.distributed.parallel_state": {"get_tensor_model_parallel_rank": get_tensor_model_parallel_rank,
                                        "get_tensor_model_parallel_world_size": get_tensor_model_parallel_world_size,
                                        "get_tp_group": get_tp_group, "get_pp_group": get_pp_group,
                                        "GroupCoordinator": GroupCoordinator},
    "vllm.distributed": {"get_tensor_model_parallel_rank": get_tensor_model_parallel_rank,
                         "get_tensor_model_parallel_world_size": get_tensor_model_parallel_world_size,
                         "get_tp_group": get_tp_group, "get_pp_group": get_pp_group},
    "vllm.distributed.kv_events": {
        "KVCacheEvent": KVCacheEvent, "BlockStored": BlockStored, "BlockRemoved": BlockRemoved,
        "AllBlocksCleared": AllBlocksCleared, "KVEventBatch": KVEventBatch,
        "KVConnectorKVEvents": KVConnectorKVEvents, "MEDIUM_GPU": MEDIUM_GPU, "MEDIUM_CPU": MEDIUM_CPU,
        "MEDIUM_STORAGE": MEDIUM_STORAGE,
    },
    "vllm.distributed.kv_transfer.kv_connector.v1.metrics": {"KVConnectorStats": KVConnectorStats},
    "vllm.utils.math_utils": {"cdiv": cdiv, "round_up": round_up, "round_down": round_down},
    "vllm.model_executor.models.utils": {"extract_layer_index": extract_layer_index},
    "vllm.sampling_params": {"SamplingParams": SamplingParams},
    "vllm.v1.core.sched.output": {
        "SchedulerOutput": SchedulerOutput, "NewRequestData": NewRequestData,
        "CachedRequestData": CachedRequestData, "KVConnectorBlockState": KVConnectorBlockState,
    },
    "vllm.v1.request": {"Request": Request, "RequestStatus": RequestStatus},
    "vllm.v1.outputs": {"KVConnectorOutput": KVConnectorOutput},
}


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves every ``vllm`` module (known contents, placeholders for the rest) and the store modules."""

    def __init__(self, store_modules: Sequence[str], store: RecordingStore) -> None:
        self.store_roots = tuple(store_modules)
        self.store = store

    def _serves(self, name: str) -> bool:
        roots = ("vllm", *self.store_roots)
        return any(name == root or name.startswith(root + ".") for root in roots)

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> Any:
        if not self._serves(fullname):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        name = spec.name
        if any(name == root or name.startswith(root + ".") for root in self.store_roots):
            return _StoreModule(name, self.store)
        module = _StubModule(name)
        module.__path__ = []
        module.__dict__.update(_CONTENTS.get(name, {}))
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return


@contextmanager
def stub_modules(store_modules: Sequence[str], store: RecordingStore) -> Iterator[None]:
    """Within the block, ``import vllm...`` and the named store modules resolve to the stubs (the real
    modules, if any were imported, are hidden and restored afterwards), and ``torch.cuda``'s events and streams
    are CPU stand-ins where CUDA is absent."""
    roots = ("vllm", *store_modules)
    hidden = {n: m for n, m in sys.modules.items() if any(n == r or n.startswith(r + ".") for r in roots)}
    for name in hidden:
        del sys.modules[name]
    finder = _Finder(store_modules, store)
    sys.meta_path.insert(0, finder)
    try:
        with cuda_standins():
            yield
    finally:
        sys.meta_path.remove(finder)
        for name in [n for n in sys.modules if any(n == r or n.startswith(r + ".") for r in roots)]:
            del sys.modules[name]
        sys.modules.update(hidden)
