"""Scraping a Spar process's ``/metrics`` as Prometheus does, and the metric families each
process is meant to export (the ``FAMILIES`` of ``api.metrics``, ``workers.metrics`` and
``scheduler.metrics``, and the queue gauges the API reads at scrape time)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from email.message import Message

import httpx
from dramatiq.brokers.stub import StubBroker
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

from api import metrics as api_metrics
from scheduler import metrics as scheduler_metrics
from workers import metrics as worker_metrics


@dataclass
class Scrape:
    content_type: str
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float]  # (name, labels) -> value
    families: set[str]  # every family named, samples or not (a Spar family, by its name)

    def value(self, name: str, **labels: str) -> float | None:
        return self.samples.get((name, frozenset(labels.items())))


def scrape(url: str, **headers: str) -> Scrape:
    """GET ``url``, checked as a scraper reads it: 200, one Content-Type header whose
    parameters are each named once, a body prometheus_client's text parser reads whole."""
    response = httpx.get(url, headers=headers, timeout=10.0)
    assert response.status_code == 200, response.text
    (content_type,) = response.headers.get_list("content-type")
    header = Message()
    header["content-type"] = content_type
    names = [name for name, _ in header.get_params()[1:]]
    assert len(names) == len(set(names)), content_type
    return parse(content_type, response.text)


def parse(content_type: str, text: str) -> Scrape:
    families = list(text_string_to_metric_families(text))
    return Scrape(
        content_type=content_type,
        samples={
            (s.name, frozenset(s.labels.items())): s.value for f in families for s in f.samples
        },
        families={f.name for f in families},
    )


def names(metrics: Iterable[MetricWrapperBase]) -> set[str]:
    return {family.name for metric in metrics for family in metric.describe()}


def spar_families(found: Scrape) -> set[str]:
    """Spar's families in a scrape; a counter's or histogram's ``_created`` series (which
    the text format gives as a family of its own) under its family's name."""
    return {name.removesuffix("_created") for name in found.families if name.startswith("spar_")}


QUEUE_FAMILIES = {family.name for family in api_metrics.QueueCollector(StubBroker()).collect()}
API = names(api_metrics.FAMILIES) | QUEUE_FAMILIES
WORKER = names(worker_metrics.FAMILIES)
SCHEDULER = names(scheduler_metrics.FAMILIES)
