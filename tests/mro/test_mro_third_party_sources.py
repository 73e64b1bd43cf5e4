"""`deferdump mro` on connectors other projects ship for vLLM (LMCache's v1 adapters, Dynamo's KVBM connector,
PegaFlow's connector package, cpumemconnector), which are not copied into this repository: the test runs when
`DEFERDUMP_THIRD_PARTY_SOURCES` names a folder holding `lmcache/`, `dynamo/`, `pegaflow/` and `cpumemconnector/`
filled as docs/mro.md ("Other projects' connectors") shows, and is skipped otherwise. Each group of files gets the
verdicts recorded there, with the reason that decides them: where transfers happen in code none of these files
holds, no verdict but `unknown` is right; a connector that never transfers, or saves synchronously, is `safe`."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from deferdump.tools.mro.judge import ModelRunner, judge_files
from deferdump.tools.mro.tla import ModelBounds

pytestmark = pytest.mark.slow

ROOT = os.environ.get("DEFERDUMP_THIRD_PARTY_SOURCES")

#: group -> the files judged together -> connector class -> (verdict, a phrase of the reason of every case)
GROUPS: dict[str, tuple[tuple[str, ...], dict[str, tuple[str, str]]]] = {
    # the connector forwards to LMCacheConnectorV1Impl, whose hooks are wrapped in lmcache.utils' NVTX decorator
    # and whose saves go through lmcache_engine.store (LMCache's engine, not in these files)
    "lmcache-v1": (("lmcache/lmcache_connector_v1.py", "lmcache/vllm_v1_adapter.py"), {
        "LMCacheConnectorV1Dynamic": ("unknown", "@_lmcache_nvtx_annotate wraps the body"),
        "LMCacheConnectorV1Impl": ("unknown", "@_lmcache_nvtx_annotate wraps the body"),
    }),
    "lmcache-async": (("lmcache/lmcache_async_connector_v1.py", "lmcache/vllm_v1_async_adapter.py",
                       "lmcache/vllm_v1_adapter.py"), {
        "LMCacheAsyncConnectorV1Dynamic": ("unknown", "@_lmcache_nvtx_annotate wraps the body"),
        "LMCacheConnectorV1AsyncImpl": ("unknown", "@_lmcache_nvtx_annotate wraps the body"),
        "LMCacheConnectorV1Impl": ("unknown", "@_lmcache_nvtx_annotate wraps the body"),
    }),
    # the three modules each define the same DynamoConnectorMetadata (read once); the transfers are the Rust
    # KvConnectorLeader / KvConnectorWorker's
    "dynamo-kvbm": (("dynamo/dynamo_connector.py", "dynamo/connector_leader.py", "dynamo/connector_worker.py"), {
        "DynamoConnector": ("unknown", "a helper that is not a connector class"),
    }),
    # PegaFlow's connector package: the real connector hands every hook to its scheduler and worker helpers; the
    # no-op connector beside it never delays and never transfers ("" : a safe verdict has no reason to check)
    "pegaflow": (tuple(f"pegaflow/connector/{name}.py" for name in (
        "__init__", "common", "connector_metrics", "scheduler", "state_manager", "tp_shards", "worker")), {
        "PegaKVConnector": ("unknown", "a helper that is not a connector class"),
        "NoopKVConnector": ("safe", ""),
    }),
    # a synchronous save: save_kv_layer copies each layer to host memory with a blocking .cpu(); loads are synchronous
    "cpumemconnector": (("cpumemconnector/cpu_memory_connector.py",), {
        "SharedCPUMemoryConnector": ("safe", ""),
    }),
}

SKIP = ("DEFERDUMP_THIRD_PARTY_SOURCES is not set: other projects' connector sources are read, never copied "
        "here; fill a folder with lmcache/, dynamo/, pegaflow/ and cpumemconnector/ as docs/mro.md, \"Other "
        "projects' connectors\", shows")


@pytest.mark.skipif(ROOT is None, reason=SKIP)
@pytest.mark.parametrize("group", sorted(GROUPS))
def test_third_party_connector_gets_the_recorded_verdicts(group: str) -> None:
    assert ROOT is not None
    files, expected = GROUPS[group]
    paths = [Path(ROOT) / name for name in files]
    missing = [str(p) for p in paths if not p.is_file()]
    assert not missing, f"fetch the sources first (docs/mro.md): {missing}"
    report = judge_files(paths, runner=ModelRunner(ModelBounds(), timeout=300))
    got = {cls: j.verdict for cls, j in report.connectors.items()}
    assert got == {cls: verdict for cls, (verdict, _) in expected.items()}, got
    for cls, (_, phrase) in expected.items():
        for judgement in report.connectors[cls].judgements if phrase else ():
            assert any(phrase in r for r in judgement.reasons), (cls, judgement.context.key, judgement.reasons)
