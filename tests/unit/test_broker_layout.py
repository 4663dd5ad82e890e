"""The local broker's generated server.properties: the flush policy (no broker started)."""

from __future__ import annotations

from pathlib import Path

from runstream.engine.broker import BrokerCluster
from runstream.engine.broker.layout import FLUSH_MESSAGES, flush_settings, read_property


def test_flush_settings_every_write_or_kafka_default() -> None:
    assert flush_settings(True) == {FLUSH_MESSAGES: 1}
    assert flush_settings(False) == {}


def _written_config(data_dir: Path, flush_every_write: bool) -> Path:
    cluster = BrokerCluster(data_dir=data_dir, flush_every_write=flush_every_write)
    spec = cluster.nodes[0]
    cluster._write_config(spec)  # what `broker start` writes before launching the node
    return spec.config_path


def test_flush_every_write_is_in_server_properties(tmp_path: Path) -> None:
    config = _written_config(tmp_path, flush_every_write=True)
    assert "log.flush.interval.messages=1\n" in config.read_text("utf-8")
    assert read_property(config, FLUSH_MESSAGES) == "1"


def test_default_leaves_flushing_to_kafka(tmp_path: Path) -> None:
    config = _written_config(tmp_path, flush_every_write=False)
    assert read_property(config, FLUSH_MESSAGES) is None
    assert read_property(config, "process.roles") == "broker,controller"
