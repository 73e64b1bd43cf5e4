"""Prometheus metrics of one connector instance.

Each instance gets its own `CollectorRegistry` (unless given one), so several connectors in one process
(tests, ranks simulated in-process) never clash on metric names. Export with
`prometheus_client.generate_latest(metrics.registry)`.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_WAIT_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0)


class ConnectorMetrics:
    """Counters, gauges and histograms the connector updates on its own paths."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.dumps_submitted = Counter("deferdump_dumps_submitted", "Dump tasks submitted to the store", registry=r)
        self.dumps_completed = Counter("deferdump_dumps_completed", "Dump tasks waited successfully", registry=r)
        self.dumps_failed = Counter(
            "deferdump_dumps_failed", "Dump tasks that failed", ["stage"], registry=r
        )  # stage: submit | wait
        self.dump_bytes = Counter("deferdump_dump_bytes", "Bytes of dump tasks waited successfully", registry=r)
        self.loads_completed = Counter("deferdump_loads_completed", "Load tasks that filled blocks", registry=r)
        self.load_errors = Counter("deferdump_load_error_blocks", "Blocks whose load failed", registry=r)
        self.pending_tasks = Gauge("deferdump_pending_dump_tasks", "Dump tasks submitted, not yet waited", registry=r)
        self.live_handles = Gauge(
            "deferdump_live_event_handles", "Event handles acquired, not yet released", registry=r
        )
        self.get_finished_wait = Histogram(
            "deferdump_get_finished_wait_seconds", "Time get_finished spent waiting dump tasks",
            buckets=_WAIT_BUCKETS, registry=r,
        )
        self.preemption_wait = Histogram(
            "deferdump_handle_preemptions_wait_seconds", "Time handle_preemptions spent waiting dump tasks",
            buckets=_WAIT_BUCKETS, registry=r,
        )
        self.external_hit_tokens = Counter(
            "deferdump_external_hit_tokens", "Tokens the scheduler found in the store beyond the HBM prefix", registry=r
        )
        self.finished_sending = Counter(
            "deferdump_finished_sending", "Request ids reported in finished_sending", registry=r
        )
        self.verify_mismatches = Counter(
            "deferdump_verify_mismatches", "Dumped blocks whose stored bytes differ from the source at submit",
            registry=r,
        )

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        """A sample's current value (0.0 when absent), for tests and the CLI."""
        sample = self.registry.get_sample_value(name, labels or {})
        return 0.0 if sample is None else sample
