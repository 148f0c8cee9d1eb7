"""Prometheus metrics, one registry per app instance (so tests can build several apps in one process).

Counters count what this process did; under `fusebot serve` the background loop is a child process, so the
authoritative numbers are the gauges read from the database at scrape time (`fusebot_jobs`, `fusebot_deliveries`).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.webhooks = Counter(
            "fusebot_webhook_deliveries", "Webhook deliveries by event and outcome", ["event", "outcome"],
            registry=self.registry,
        )
        self.webhook_seconds = Histogram(
            "fusebot_webhook_response_seconds", "Time to answer POST /webhook", registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.processed = Counter(
            "fusebot_deliveries_processed", "Deliveries handled by the background loop", ["outcome"],
            registry=self.registry,
        )
        self.jobs_created = Counter("fusebot_jobs_created", "Jobs recorded", ["trigger"], registry=self.registry)
        # read from the database at each scrape: true whichever process did the work
        self.jobs = Gauge("fusebot_jobs", "Jobs by state", ["state"], registry=self.registry)
        self.deliveries = Gauge("fusebot_deliveries", "Webhook inbox by status", ["status"], registry=self.registry)
        self.runner_calls = Counter(
            "fusebot_runner_requests", "Runner API calls", ["endpoint", "outcome"], registry=self.registry
        )
