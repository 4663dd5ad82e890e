"""WorkerMetrics: every method lands in its series with the exact value; /metrics is served
over HTTP; a failing runs source does not break a scrape; two workers do not clash."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator, Mapping

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from runstream.engine.observability.metrics import LATENCY_BUCKETS, WorkerMetrics
from runstream.projections.state import Verdict

Labels = tuple[tuple[str, str], ...]


def _samples(text: bytes | str) -> dict[tuple[str, Labels], float]:
    if isinstance(text, bytes):
        text = text.decode()
    out: dict[tuple[str, Labels], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _value(samples: Mapping[tuple[str, Labels], float], name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def _names(samples: Mapping[tuple[str, Labels], float]) -> set[str]:
    return {name for name, _ in samples}


@pytest.fixture
def metrics() -> Iterator[WorkerMetrics]:
    m = WorkerMetrics()
    yield m
    m.close()


def test_every_method_lands_in_its_series(metrics: WorkerMetrics) -> None:
    m = metrics
    m.claim("applied")
    m.claim("applied")
    m.claim("rejected")
    m.claim("lost")
    m.activation("new")
    m.activation("claimed")
    m.activation("stolen")
    m.activation("resumed")
    m.activation("resumed")
    m.decision("StepCompleted")
    m.decision("StepCompleted")
    m.decision("RunCompleted")
    m.verdict("applied", "StepCompleted")
    m.verdict("fenced", "StepCompleted")
    m.verdict(Verdict.fenced, "RunCompleted")  # the reducer's StrEnum works as is
    m.verdict("duplicate", "CreateRequested")
    for v in ("ignored", "rejected", "refused", "dead-letter"):
        m.verdict(v, "X")
    m.step("checkout", "charge", 0.003, ok=True)
    m.step("checkout", "charge", 2.0, ok=False)
    m.step("checkout", "ship", 0.5, ok=True)
    m.timers_fired()
    m.timers_fired(3)
    m.timers_fired(0)
    m.signal_delivered()
    m.signal_delivered()
    m.settled("checkout", "completed", 12.5)
    m.settled("checkout", "failed", 0.2)
    m.settled("checkout", "completed", -1.0)  # clock skew: clamped at 0
    m.set_consumer_lag(0, 5)
    m.set_consumer_lag(1, 7)
    m.set_consumer_lag(1, 9)
    m.set_consumer_lag(2, 1)
    m.forget_partition(2)
    m.forget_partition(42)  # never seen: a no-op
    m.set_read_model_lag(11)
    m.runs_gauges(lambda: ({("checkout", "running"): 3, ("checkout", "suspended"): 2,
                            ("other", "running"): 1},
                           {("checkout", "timer"): 1, ("checkout", "event"): 1}))

    s = _samples(m.render())
    assert _value(s, "runstream_claims_total", outcome="applied") == 2
    assert _value(s, "runstream_claims_total", outcome="rejected") == 1
    assert _value(s, "runstream_claims_total", outcome="lost") == 1
    assert _value(s, "runstream_activations_total", mode="new") == 1
    assert _value(s, "runstream_activations_total", mode="claimed") == 1
    assert _value(s, "runstream_activations_total", mode="stolen") == 1
    assert _value(s, "runstream_activations_total", mode="resumed") == 2
    assert _value(s, "runstream_decisions_total", type="StepCompleted") == 2
    assert _value(s, "runstream_decisions_total", type="RunCompleted") == 1
    assert _value(s, "runstream_records_total", verdict="applied", type="StepCompleted") == 1
    assert _value(s, "runstream_records_total", verdict="fenced", type="StepCompleted") == 1
    assert _value(s, "runstream_records_total", verdict="fenced", type="RunCompleted") == 1
    assert _value(s, "runstream_records_total", verdict="duplicate",
                  type="CreateRequested") == 1
    for v in ("ignored", "rejected", "refused", "dead-letter"):
        assert _value(s, "runstream_records_total", verdict=v, type="X") == 1
    assert _value(s, "runstream_fenced_records_total") == 2
    assert _value(s, "runstream_duplicate_records_total") == 1

    assert _value(s, "runstream_step_attempts_total", flow="checkout", step="charge") == 2
    assert _value(s, "runstream_step_attempts_total", flow="checkout", step="ship") == 1
    assert _value(s, "runstream_step_failures_total", flow="checkout", step="charge") == 1
    assert ("runstream_step_failures_total",
            (("flow", "checkout"), ("step", "ship"))) not in s  # never failed: no series
    charge = {"flow": "checkout", "step": "charge"}
    assert _value(s, "runstream_step_duration_seconds_count", **charge) == 2
    assert _value(s, "runstream_step_duration_seconds_sum", **charge) == pytest.approx(2.003)
    assert _value(s, "runstream_step_duration_seconds_bucket", le="0.001", **charge) == 0
    assert _value(s, "runstream_step_duration_seconds_bucket", le="0.005", **charge) == 1
    assert _value(s, "runstream_step_duration_seconds_bucket", le="2.5", **charge) == 2
    assert _value(s, "runstream_step_duration_seconds_bucket", le="600.0", **charge) == 2
    assert _value(s, "runstream_step_duration_seconds_bucket", le="+Inf", **charge) == 2
    les = {dict(labels)["le"] for name, labels in s
           if name == "runstream_step_duration_seconds_bucket" and dict(labels)["step"] == "ship"}
    assert len(les) == len(LATENCY_BUCKETS) + 1

    assert _value(s, "runstream_timers_fired_total") == 4
    assert _value(s, "runstream_signals_delivered_total") == 2

    done = {"flow": "checkout", "status": "completed"}
    assert _value(s, "runstream_create_to_settle_seconds_count", **done) == 2
    assert _value(s, "runstream_create_to_settle_seconds_sum", **done) == 12.5
    assert _value(s, "runstream_create_to_settle_seconds_bucket", le="0.001", **done) == 1
    assert _value(s, "runstream_create_to_settle_seconds_bucket", le="10.0", **done) == 1
    assert _value(s, "runstream_create_to_settle_seconds_bucket", le="30.0", **done) == 2
    assert _value(s, "runstream_create_to_settle_seconds_count", flow="checkout",
                  status="failed") == 1

    assert _value(s, "runstream_consumer_lag_records", partition="0") == 5
    assert _value(s, "runstream_consumer_lag_records", partition="1") == 9
    assert ("runstream_consumer_lag_records", (("partition", "2"),)) not in s
    assert _value(s, "runstream_read_model_lag_records") == 11

    assert _value(s, "runstream_runs", flow="checkout", status="running") == 3
    assert _value(s, "runstream_runs", flow="checkout", status="suspended") == 2
    assert _value(s, "runstream_runs", flow="other", status="running") == 1
    assert _value(s, "runstream_suspended_runs", flow="checkout", reason="timer") == 1
    assert _value(s, "runstream_suspended_runs", flow="checkout", reason="event") == 1

    assert all(name.startswith("runstream_") for name in _names(s))


def test_runs_gauges_are_computed_at_scrape_time_and_the_source_can_be_replaced(
        metrics: WorkerMetrics) -> None:
    counts = {("f", "running"): 1}
    metrics.runs_gauges(lambda: (counts, {}))
    assert _value(_samples(metrics.render()), "runstream_runs", flow="f", status="running") == 1
    counts[("f", "running")] = 4
    assert _value(_samples(metrics.render()), "runstream_runs", flow="f", status="running") == 4
    metrics.runs_gauges(lambda: ({("f", "completed"): 8}, {("f", "child"): 2}))
    s = _samples(metrics.render())
    assert _value(s, "runstream_runs", flow="f", status="completed") == 8
    assert ("runstream_runs", (("flow", "f"), ("status", "running"))) not in s
    assert _value(s, "runstream_suspended_runs", flow="f", reason="child") == 2


def test_a_runs_source_that_raises_does_not_break_the_scrape(metrics: WorkerMetrics) -> None:
    def broken() -> tuple[Mapping[tuple[str, str], int], Mapping[tuple[str, str], int]]:
        raise RuntimeError("read model closed")

    metrics.claim("applied")
    metrics.runs_gauges(broken)
    s = _samples(metrics.render())
    assert _value(s, "runstream_claims_total", outcome="applied") == 1
    assert not {"runstream_runs", "runstream_suspended_runs"} & _names(s)

    port = metrics.serve(0)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        assert _value(_samples(response.read()), "runstream_claims_total",
                      outcome="applied") == 1


def test_serve_exposes_metrics_over_http_until_closed() -> None:
    m = WorkerMetrics()
    try:
        m.signal_delivered()
        m.decision("RunCompleted")
        port = m.serve(0)
        assert port > 0
        with pytest.raises(RuntimeError):
            m.serve(0)
        url = f"http://127.0.0.1:{port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.status == 200
            body = response.read()
        s = _samples(body)
        assert _value(s, "runstream_signals_delivered_total") == 1
        assert _value(s, "runstream_decisions_total", type="RunCompleted") == 1
    finally:
        m.close()
    m.close()  # idempotent
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=2)


def test_two_workers_in_one_process_do_not_clash() -> None:
    a, b = WorkerMetrics(), WorkerMetrics()
    a.claim("applied")
    a.runs_gauges(lambda: ({("f", "running"): 1}, {}))
    b.claim("lost")
    b.runs_gauges(lambda: ({("f", "running"): 2}, {}))
    sa, sb = _samples(a.render()), _samples(b.render())
    assert _value(sa, "runstream_claims_total", outcome="applied") == 1
    assert ("runstream_claims_total", (("outcome", "lost"),)) not in sa
    assert _value(sb, "runstream_claims_total", outcome="lost") == 1
    assert ("runstream_claims_total", (("outcome", "applied"),)) not in sb
    assert _value(sa, "runstream_runs", flow="f", status="running") == 1
    assert _value(sb, "runstream_runs", flow="f", status="running") == 2


def test_a_given_registry_is_used_and_the_default_one_is_not() -> None:
    from prometheus_client import REGISTRY

    registry = CollectorRegistry()
    m = WorkerMetrics(registry)
    assert m.registry is registry
    m.timers_fired(2)
    assert registry.get_sample_value("runstream_timers_fired_total") == 2
    assert REGISTRY.get_sample_value("runstream_timers_fired_total") is None
    with pytest.raises(ValueError):  # one WorkerMetrics per registry
        WorkerMetrics(registry)
