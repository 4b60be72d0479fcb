"""MQTT output throughput: N events/s sustained through the real `MqttSink` to subscribers at QoS 1, counting loss.

Why (issue 15's target: 1,000 events/s to two subscribers at QoS 1 with zero loss on loopback): the figure depends
on paho's queue and in-flight limits and on the broker, so it is measured end to end: events offered to the sink at
a steady rate (as the daemon's event bus offers them), published by the sink (its seq, its topic template, QoS 1),
routed by a real mosquitto, received by real paho subscribers with persistent sessions. Loss = seqs offered and
not received by a subscriber after de-duplication; latency = receive time minus the event's `ts` (same clock).

    python -m pipeline.tools.bench_mqtt --rate 1000 --seconds 30 --subscribers 2 [--json out.json]

Without --port it starts `mosquitto` (Debian's package) from a config file in a temp dir, loopback only, with
`max_queued_messages` raised as the README says to run it; with --port it uses a broker already listening there.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from pipeline.outputs.mqtt import MqttOutput, MqttSink

log = logging.getLogger(__name__)

TOPIC_FILTER = "bench/+/+/command"


class Counter:
    """One subscriber: unique seqs, duplicates and latencies of what it received."""

    def __init__(self, port: int, name: str) -> None:
        self.seqs: set[int] = set()
        self.duplicates = 0
        self.latency_ms: list[float] = []
        self._ready = threading.Event()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=name, clean_session=False)
        self.client.max_inflight_messages_set(100)
        self.client.on_connect = lambda c, _u, _f, _r, _p: c.subscribe(TOPIC_FILTER, qos=1)
        self.client.on_subscribe = lambda *_: self._ready.set()
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        if not self._ready.wait(10):
            raise RuntimeError(f"subscriber {name}: no SUBACK within 10 s")

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        event = json.loads(message.payload)
        if event["seq"] in self.seqs:
            self.duplicates += 1
            return
        self.seqs.add(event["seq"])
        self.latency_ms.append((time.time() - event["ts"]) * 1000.0)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def start_broker(workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    """mosquitto on a free loopback port, from a config file in `workdir` (which it may write as any user)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    config = workdir / "mosquitto.conf"
    config.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\nmax_queued_messages 100000\n"
                      "max_inflight_messages 100\npersistence false\n")
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    proc = subprocess.Popen([binary, "-c", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return proc, port
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"mosquitto did not listen on {port} within 10 s")


def offer_steadily(sink: MqttSink, rate: float, seconds: float) -> int:
    """Offer `rate` command events a second for `seconds` (paced on the monotonic clock); how many were offered."""
    total, began = int(rate * seconds), time.monotonic()
    for n in range(total):
        wait = began + n / rate - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        sink.offer({"type": "command", "camera": f"cam{n % 4}", "ts": time.time(), "target": n % 7,
                    "emotion": "happy", "confidence": 0.91, "reason": "bench",
                    "expression": {"preset": "happy", "weight": 0.9, "blend_ms": 200},
                    "tone": {"style": "cheerful", "style_degree": 1.0, "pitch": "+5%", "rate": "+5%",
                             "volume": "+0%"}, "latency_ms": {"total": 3.0}})
    return total


def run_bench(port: int, rate: float, seconds: float, subscribers: int, drain_s: float) -> dict[str, Any]:
    """One run against the broker on `port`; the figures as a dict."""
    counters = [Counter(port, f"bench-sub-{i}") for i in range(subscribers)]
    sink = MqttSink(MqttOutput(port=port, site="bench", topic="bench/{site}/{camera}/{type}", events=["command"],
                               client_id="bench-publisher", queue_size=100_000))
    sink.start()
    began, cpu_began = time.monotonic(), time.process_time()
    offered = offer_steadily(sink, rate, seconds)
    offer_s = time.monotonic() - began
    cpu_s = time.process_time() - cpu_began  # this process: the sink, paho's threads and the subscribers
    deadline = time.monotonic() + drain_s
    while time.monotonic() < deadline and any(len(c.seqs) < offered for c in counters):
        time.sleep(0.05)
    sink.close()
    for counter in counters:
        counter.close()
    return {"rate": rate, "seconds": seconds, "offered": offered, "offer_rate": round(offered / offer_s, 1),
            "sent": sink.sent, "dropped": sink.dropped, "failed": sink.failed,
            "cpu_percent_publisher_and_subscribers": round(100.0 * cpu_s / offer_s, 1),
            "subscribers": [{"received_unique": len(c.seqs), "lost": offered - len(c.seqs),
                             "duplicates": c.duplicates,
                             "latency_ms_p50": round(statistics.median(c.latency_ms), 2) if c.latency_ms else None,
                             "latency_ms_p99": round(_p99(c.latency_ms), 2) if c.latency_ms else None}
                            for c in counters]}


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.tools.bench_mqtt", description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=1000.0, help="events offered per second (default 1000)")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long to offer them (default 30)")
    parser.add_argument("--subscribers", type=int, default=2, help="QoS 1 subscribers (default 2)")
    parser.add_argument("--port", type=int, help="use the broker on 127.0.0.1:PORT instead of starting mosquitto")
    parser.add_argument("--drain-s", type=float, default=30.0, help="wait at most this long for stragglers")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    with tempfile.TemporaryDirectory(prefix="bench-mqtt-") as workdir:
        broker, port = (None, args.port) if args.port else start_broker(Path(workdir))
        try:
            result = run_bench(port, args.rate, args.seconds, args.subscribers, args.drain_s)
        finally:
            if broker is not None:
                broker.terminate()
                broker.wait(10)
    text = json.dumps(result, indent=2)
    sys.stdout.write(text + "\n")
    if args.json:
        args.json.write_text(text + "\n")
    lost = sum(s["lost"] for s in result["subscribers"])
    return 0 if lost == 0 and not result["dropped"] and not result["failed"] else 1


if __name__ == "__main__":
    sys.exit(main())
