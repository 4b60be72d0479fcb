"""Issue 26 item 8 (c): the MQTT `seq` keeps rising across a daemon restart and an outputs reload.

A consumer drops QoS 1 repeats by `seq` (pipeline.outputs.mqtt's docstring tells it to). If a new run of the output
started `seq` again where the last one started, that consumer would take every event of the new run for a repeat and
drop it, silently, until the new run passed the old one's count. Here a real subscriber on a real mosquitto broker
(tests/servers/mosquitto.py, as tests/test_mqtt.py uses it) watches two runs of the real MQTT sink:

- a restart: two processes one after the other, each its own sink with the same client id (a daemon stopped and
  started again; a counter kept in the process could not pass this);
- a reload: a new sink in the same process opened before the old one is closed (how the daemon swaps outputs).

In both, the second run's first `seq` is above the first run's last, and a de-duplicating consumer keeps every event.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from pipeline.outputs.mqtt import MqttOutput, MqttSink
from tests.conftest import ROOT
from tests.running_daemon import wait_until
from tests.servers.mosquitto import Mosquitto
from tests.test_mqtt import Subscriber, broker_port  # noqa: F401  (broker_port: the fixture, skip without mosquitto)

EVENTS_PER_RUN = 20

# One run of the output in a process of its own: open, publish `count` commands, wait until all are handed over,
# close (a daemon's stop).
RUN = """
import sys, time
from pipeline.outputs.mqtt import MqttOutput, MqttSink
port, count, run = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
sink = MqttSink(MqttOutput(port=port, site="seq", client_id="emotion-test-seq-restart", events=["command"]))
sink.start()
for n in range(count):
    sink.offer({"type": "command", "camera": "lobby", "ts": 1.0, "target": n, "run": run, "emotion": "happy",
                "confidence": 0.9, "reason": "test", "expression": {"preset": "happy", "weight": 0.9,
                "blend_ms": 200}, "tone": {}, "latency_ms": {}})
deadline = time.monotonic() + 30
while sink.sent < count and time.monotonic() < deadline:
    time.sleep(0.02)
sink.close()
sys.exit(0 if sink.sent == count else 1)
"""


def _command(run: int, n: int) -> dict[str, Any]:
    return {"type": "command", "camera": "lobby", "ts": 1.0, "target": n, "run": run, "emotion": "happy",
            "confidence": 0.9, "reason": "test", "expression": {"preset": "happy", "weight": 0.9, "blend_ms": 200},
            "tone": {}, "latency_ms": {}}


def _seqs_by_run(subscriber: Subscriber) -> dict[int, list[int]]:
    """The `seq`s each run published, in the order the subscriber received them."""
    runs: dict[int, list[int]] = {}
    for payload in subscriber.payloads("/command"):
        runs.setdefault(payload["run"], []).append(payload["seq"])
    return runs


def _deduplicated(subscriber: Subscriber) -> list[tuple[int, int]]:
    """(run, target) of each event a consumer keeps when it drops every `seq` it has already seen."""
    seen: set[int] = set()
    kept = []
    for payload in subscriber.payloads("/command"):
        if payload["seq"] not in seen:
            seen.add(payload["seq"])
            kept.append((payload["run"], payload["target"]))
    return kept


def _check_second_run_continues(subscriber: Subscriber) -> None:
    assert wait_until(lambda: len(subscriber.payloads("/command")) >= 2 * EVENTS_PER_RUN, 30), \
        len(subscriber.payloads("/command"))
    runs = _seqs_by_run(subscriber)
    assert sorted(runs) == [1, 2] and all(len(set(s)) == EVENTS_PER_RUN for s in runs.values()), runs
    assert all(later > earlier for earlier, later in zip(runs[1], runs[1][1:])), runs[1]  # rising within a run
    assert min(runs[2]) > max(runs[1]), f"seq went back: run 1 ended at {max(runs[1])}, run 2 began at " \
                                        f"{min(runs[2])}"
    kept = _deduplicated(subscriber)
    assert sorted(kept) == [(run, n) for run in (1, 2) for n in range(EVENTS_PER_RUN)], \
        f"a consumer de-duplicating by seq dropped {2 * EVENTS_PER_RUN - len(kept)} events"


def test_seq_keeps_rising_across_a_daemon_restart(broker_port: int) -> None:  # noqa: F811
    with Mosquitto(broker_port) as _broker:
        subscriber = Subscriber(broker_port, "emotion/seq/+/command", "consumer-seq-restart")
        try:
            for run in (1, 2):
                done = subprocess.run([sys.executable, "-c", RUN, str(broker_port), str(EVENTS_PER_RUN), str(run)],
                                      cwd=ROOT, capture_output=True, text=True, timeout=90, check=False)
                assert done.returncode == 0, done.stderr[-2000:]
            _check_second_run_continues(subscriber)
        finally:
            subscriber.close()


def test_seq_keeps_rising_across_an_outputs_reload(broker_port: int) -> None:  # noqa: F811
    settings = MqttOutput(port=broker_port, site="seq", client_id="emotion-test-seq-reload", events=["command"],
                          reconnect_min_s=0.2)
    with Mosquitto(broker_port) as _broker:
        subscriber = Subscriber(broker_port, "emotion/seq/+/command", "consumer-seq-reload")
        old = MqttSink(settings)
        new: MqttSink | None = None
        try:
            old.start()
            for n in range(EVENTS_PER_RUN):
                old.offer(_command(1, n))
            assert wait_until(lambda: old.sent == EVENTS_PER_RUN, 30), (old.sent, old.failed)
            new = MqttSink(settings)  # a reload opens the new outputs, then closes the old ones
            new.start()
            old.close()
            for n in range(EVENTS_PER_RUN):
                new.offer(_command(2, n))
            assert wait_until(lambda: new is not None and new.sent == EVENTS_PER_RUN, 30), (new.sent, new.failed)
            _check_second_run_continues(subscriber)
        finally:
            for sink in (old, new):
                if sink is not None and sink.is_alive():
                    sink.close()
            subscriber.close()
