"""The OSC output's expression stream, name sets and plain per-avatar state (issue 14).

The blend curve is checked exactly on the pure module with a fake clock; everything else against a real python-osc
UDP receiver (`OscReceiver` of the sink tests). No test asserts timing: counts are awaited, never timed. The 60 s rate
and gap measurement of BENCHMARKS.md is `python -m tests.test_osc_stream --seconds 60` (`measure_stream`).

The modules of the issue are imported inside the tests, so on code without them each test fails on its own.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from pipeline.behavior.settings import BehaviorConfig
from pipeline.config.app import load_config
from pipeline.outputs.events import Event
from pipeline.outputs.osc import VMC_APPLY, VMC_VAL, OscOutput, OscSink
from tests.running_daemon import wait_until
from tests.test_sinks_osc_webhook import (
    OscReceiver,
    closed_port,
    commands_from_mapper,
    started,
)

log = logging.getLogger(__name__)

VMC_TIME = "/VMC/Ext/T"
Frame = tuple[float, dict[str, float]]  # (stream time, {name: weight})


def command(emotion: str, blend_ms: int | None = None, **changes: Any) -> Event:
    """A command event from the real mapper (default rules), its blend time or other fields changed."""
    (event,) = commands_from_mapper(BehaviorConfig(), [emotion])
    if blend_ms is not None:
        event["expression"] = {**event["expression"], "blend_ms": blend_ms}
    return {**event, **changes}


def idle_command(blend_ms: int = 0) -> Event:
    """What the mapper sends after idle_after_s: the neutral rule, reason idle, no target."""
    return command("neutral", blend_ms, reason="idle", target=None, confidence=1.0)


def frames(receiver: OscReceiver) -> list[Frame]:
    """Every stream bundle received, in stream-time order (UDP and the threading server may reorder datagrams)."""
    out = []
    for is_bundle, messages in list(receiver.packets):
        assert is_bundle and messages[-1] == (VMC_APPLY, ())
        stamp = next(args[0] for address, args in messages if address == VMC_TIME)
        out.append((stamp, {args[0]: args[1] for address, args in messages if address == VMC_VAL}))
    return sorted(out, key=lambda frame: frame[0])


def stream(port: int, **settings: Any) -> OscSink:
    return started(OscSink(OscOutput(port=port, **settings),
                           presets=BehaviorConfig().rule_presets()))


def wait_for_frame(receiver: OscReceiver, test: Any, timeout: float = 30.0) -> dict[str, float]:
    """The first received frame (in stream order) that passes `test`; fails the test when none comes."""
    found: list[dict[str, float]] = []

    def seen() -> bool:
        found[:] = [weights for _, weights in frames(receiver) if test(weights)][:1]
        return bool(found)

    assert wait_until(seen, timeout), frames(receiver)[-3:]
    return found[0]


# --- the pure blend ---------------------------------------------------------------------------------------------------


def test_blend_moves_linearly_and_monotonically_from_old_to_new_over_blend_ms() -> None:
    from pipeline.outputs.expression_stream import ExpressionStream

    face = ExpressionStream()
    assert face.weights(0.0) == {}
    face.command({"happy": 0.8}, blend_ms=400, now=10.0)
    assert face.weights(10.0) == {"happy": 0.0}
    assert face.weights(10.1)["happy"] == pytest.approx(0.2)
    assert face.weights(10.4) == {"happy": pytest.approx(0.8)}
    assert face.weights(99.0) == {"happy": pytest.approx(0.8)}
    face.command({"sad": 0.6}, blend_ms=200, now=20.0)  # attack of sad and release of happy take the same 200 ms
    samples = [face.weights(20.0 + k * 0.01) for k in range(26)]
    happy, sad = [s.get("happy", 0.0) for s in samples], [s.get("sad", 0.0) for s in samples]
    assert happy[0] == pytest.approx(0.8) and sad[0] == 0.0
    assert all(a >= b for a, b in zip(happy, happy[1:])) and all(a <= b for a, b in zip(sad, sad[1:]))
    assert happy[10] == pytest.approx(0.4) and sad[10] == pytest.approx(0.3)  # halfway at 100 ms
    assert happy[-1] == pytest.approx(0.0) and sad[-1] == pytest.approx(0.6)


def test_blend_retargeted_midway_starts_from_the_face_shown_and_zero_blend_jumps() -> None:
    from pipeline.outputs.expression_stream import ExpressionStream

    face = ExpressionStream()
    face.command({"happy": 1.0}, blend_ms=1000, now=0.0)
    face.command({"neutral": 1.0}, blend_ms=1000, now=0.5)  # happy was at 0.5: it falls from there, no jump
    assert face.weights(0.5)["happy"] == pytest.approx(0.5)
    assert face.weights(1.0) == {"happy": pytest.approx(0.25), "neutral": pytest.approx(0.5)}
    face.command({"sad": 0.7}, blend_ms=0, now=2.0)
    assert face.weights(2.0) == {"neutral": pytest.approx(0.0), "sad": pytest.approx(0.7)}
    assert face.target == {"sad": 0.7}


# --- name sets --------------------------------------------------------------------------------------------------------


def test_name_sets_translate_the_rules_expression() -> None:
    from pipeline.outputs.name_sets import NameSet

    vrm0 = NameSet("vrm0")
    assert vrm0.weights("happy", 0.9) == {"Joy": 0.9}
    assert [vrm0.weights(p, 1.0) for p in ("angry", "sad", "relaxed", "neutral")] == [
        {"Angry": 1.0}, {"Sorrow": 1.0}, {"Fun": 1.0}, {"Neutral": 1.0}]
    assert vrm0.weights("surprised", 0.8) == {"Joy": 0.8}
    assert vrm0.weights("wink", 0.5) == {"wink": 0.5}  # a custom expression of the avatar passes through
    assert vrm0.names()[:5] == ["Joy", "Angry", "Sorrow", "Fun", "Neutral"]
    arkit = NameSet("arkit")
    happy = arkit.weights("happy", 0.5)
    assert {"cheekSquintLeft", "cheekSquintRight", "mouthSmileLeft", "mouthSmileRight"} <= set(happy)
    assert happy["mouthSmileLeft"] == pytest.approx(0.5)  # the table's 1.0 times the rule's weight
    assert {"browInnerUp", "browOuterUpLeft", "browOuterUpRight", "eyeWideLeft", "eyeWideRight",
            "jawOpen"} <= set(arkit.weights("surprised", 1.0))
    assert arkit.weights("neutral", 1.0) == {}
    custom = NameSet("custom", {"happy": {"Smile": 1.0, "Cheeks": 0.5}})
    assert custom.weights("happy", 0.8) == {"Smile": 0.8, "Cheeks": 0.4}
    assert custom.weights("sad", 1.0) == {}  # an expression the map leaves out: the face at rest
    assert NameSet("vrm1").weights("happy", 0.9) == {"happy": 0.9}


# --- settings ---------------------------------------------------------------------------------------------------------


def test_stream_settings_defaults() -> None:
    vmc, plain = OscOutput(), OscOutput(protocol="plain")
    assert (vmc.mode, vmc.names, vmc.rate_hz, vmc.intensity) == ("stream", "vrm1", 30.0, "fixed")
    assert plain.mode == "commands"
    assert OscOutput(mode="commands").mode == "commands"


@pytest.mark.parametrize(("entry", "line", "key", "fragment"), [
    ("{type: osc, names: custom}", 3, "outputs[0].names", "names: custom needs a custom_names map"),
    ("{type: osc, names: custom, custom_names: {glee: {Smile: 1}}}", 3, "outputs[0].custom_names.glee",
     "unknown expression"),
    ("{type: osc, custom_names: {happy: {Smile: 1}}}", 3, "outputs[0].names", "read only with names: custom"),
    ("{type: osc, protocol: plain, rate_hz: 10}", 3, "outputs[0].rate_hz", "for protocol vmc only"),
    ("{type: osc, rate_hz: 0}", 3, "outputs[0].rate_hz", "greater than or equal to 1"),
    ("{type: osc, intensity: loud}", 3, "outputs[0].intensity", "confidence"),
])
def test_stream_settings_errors_name_file_line_and_key(tmp_path: Path, entry: str, line: int, key: str,
                                                       fragment: str) -> None:
    from pipeline.config.loader import ConfigError

    path = tmp_path / "cfg.yaml"
    path.write_text(f"cameras:\n  - {{name: lobby, source: demo}}\noutputs:\n  - {entry}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path, env={})
    texts = [issue.format() for issue in caught.value.issues]
    assert any(text.startswith(f"{path}:{line + 1}: {key}: ") and fragment in text for text in texts), texts


# --- the stream against a real receiver -------------------------------------------------------------------------------


def test_stream_sends_whole_bundles_continuously_without_commands() -> None:
    with OscReceiver() as receiver:
        sink = stream(receiver.port, rate_hz=60)
        try:
            assert wait_until(lambda: len(receiver.packets) >= 30, 30)
        finally:
            sink.close()
        received = frames(receiver)
    assert len(received) >= 30
    names = [*BehaviorConfig().rule_presets()]
    assert all(set(names) <= set(weights) and not any(weights.values()) for _, weights in received)
    assert sink.sent == 0 and sink.failed == 0 and sink.delivery.failures_in_row == 0


@pytest.mark.parametrize(("names", "extra", "expected"), [
    ("vrm1", {}, {"happy": 0.9}),
    ("vrm0", {}, {"Joy": 0.9}),
    ("arkit", {}, {"mouthSmileLeft": 0.9, "mouthSmileRight": 0.9, "cheekSquintLeft": 0.63}),
    ("custom", {"custom_names": {"happy": {"Smile": 1.0, "Cheeks": 0.5}, "sad": {"Frown": 1.0}}},
     {"Smile": 0.9, "Cheeks": 0.45}),
])
def test_each_name_set_arrives(names: str, extra: dict[str, Any], expected: dict[str, float]) -> None:
    with OscReceiver() as receiver:
        sink = stream(receiver.port, names=names, **extra)
        try:
            sink.offer(command("happy", blend_ms=0))  # the default rule: preset happy at 0.9
            first = next(iter(expected))
            weights = wait_for_frame(receiver, lambda w: w.get(first, 0.0) > 0.5)
        finally:
            sink.close()
    assert {name: pytest.approx(value, abs=1e-4) for name, value in expected.items()} == \
        {name: weights[name] for name in expected}
    assert all(value == 0.0 for name, value in weights.items() if name not in expected
               and not name.startswith(("eyeSquint", "cheekSquint")))
    if names != "vrm1":
        assert "happy" not in weights and "relaxed" not in weights  # no VRM 1.0 names in another set


def test_received_weights_rise_monotonically_during_an_attack_then_hold() -> None:
    with OscReceiver() as receiver:
        sink = stream(receiver.port, rate_hz=60)
        try:
            sink.offer(command("happy", blend_ms=600))
            wait_for_frame(receiver, lambda w: w["happy"] == pytest.approx(0.9, abs=1e-4))
        finally:
            sink.close()
        happy = [weights["happy"] for _, weights in frames(receiver)]
    start = next(index for index, value in enumerate(happy) if value > 0)
    rising = happy[start:]
    assert all(a <= b + 1e-6 for a, b in zip(rising, rising[1:])), rising
    assert rising[-1] == pytest.approx(0.9, abs=1e-4)
    assert any(0.05 < value < 0.85 for value in rising), "no frame caught the face between old and new"


def test_idle_command_blends_back_to_neutral() -> None:
    with OscReceiver() as receiver:
        sink = stream(receiver.port, rate_hz=60)
        try:
            sink.offer(command("happy", blend_ms=0))
            wait_for_frame(receiver, lambda w: w["happy"] > 0.8)
            sink.offer(idle_command(blend_ms=100))
            weights = wait_for_frame(receiver, lambda w: w["happy"] == 0.0 and w["neutral"] == 1.0)
        finally:
            sink.close()
    assert {name: value for name, value in weights.items() if value} == {"neutral": 1.0}


def test_confidence_intensity_scales_the_target_but_not_idle() -> None:
    sink = OscSink(OscOutput(port=9, intensity="confidence"))
    assert sink.command_weights(command("happy", confidence=0.5)) == {"happy": pytest.approx(0.45)}
    assert sink.command_weights(idle_command()) == {"neutral": 1.0}
    assert OscSink(OscOutput(port=9)).command_weights(command("happy", confidence=0.5)) == {"happy": 0.9}


def test_refused_frames_make_the_output_fail_and_commands_count_as_failed() -> None:
    sink = stream(closed_port(), rate_hz=60)
    try:
        assert wait_until(lambda: sink.delivery.failures_in_row >= 3, 30), sink.delivery
        assert "refused" in (sink.delivery.last_error or "")
        sink.offer(command("happy"))
        assert wait_until(lambda: sink.failed == 1, 30)
    finally:
        sink.close()


# --- plain: the current expression once a second ----------------------------------------------------------------------


def test_plain_sends_each_avatars_state_every_second() -> None:
    with OscReceiver() as receiver:
        sink = started(OscSink(OscOutput(port=receiver.port, protocol="plain")))
        try:
            sink.offer(command("happy"))  # no avatar: keyed by its camera
            sink.offer(command("sad", avatar="kiosk"))
            wanted = {"/emotion/lobby/state", "/emotion/kiosk/state"}

            def both_twice() -> bool:
                addresses = [a for a, args in receiver.dispatched if len(args) == 4]
                return all(addresses.count(address) >= 2 for address in wanted)

            assert wait_until(both_twice, 30), receiver.dispatched
        finally:
            sink.close()
    states = {address: args for address, args in receiver.dispatched if address in wanted}
    lobby, kiosk = states["/emotion/lobby/state"], states["/emotion/kiosk/state"]
    assert (lobby[0], lobby[1], lobby[3]) == ("happy", "happy", "cheerful") and lobby[2] == pytest.approx(0.9)
    assert (kiosk[0], kiosk[1], kiosk[3]) == ("sad", "sad", "empathetic") and kiosk[2] == pytest.approx(0.7)


# --- the 60 s measurement (BENCHMARKS.md) -----------------------------------------------------------------------------


class TimedReceiver(OscReceiver):
    """The sink tests' receiver, also noting when each bundle's Apply was dispatched (time.monotonic)."""

    def __init__(self) -> None:
        self.arrivals: list[float] = []
        super().__init__()

    def _on_message(self, address: str, *args: Any) -> None:
        if address == VMC_APPLY:
            self.arrivals.append(time.monotonic())
        super()._on_message(address, *args)


def _gap_stats(times: list[float], rate_hz: float) -> tuple[float, int]:
    """The largest gap between consecutive times, in frames, and how many gaps exceed 2 frames."""
    gaps = [b - a for a, b in zip(times, times[1:])]
    return round(max(gaps) * rate_hz, 2), sum(gap > 2 / rate_hz for gap in gaps)


def measure_stream(seconds: float, rate_hz: float = 30.0) -> dict[str, Any]:
    """Run a stream for `seconds` into a real receiver, with a command every 1.5 s: bundles/s as received, the largest
    gap between arrivals and between the sender's frame times of the bundles received (a lost bundle shows there)."""
    emotions = ["happy", "sad", "surprise", "neutral"]
    commands = {emotion: command(emotion) for emotion in emotions}
    receiver = TimedReceiver()
    with receiver:
        sink = stream(receiver.port, rate_hz=rate_hz)
        begin = time.monotonic()
        index = 0
        while time.monotonic() - begin < seconds:
            sink.offer(commands[emotions[index % len(emotions)]])
            index += 1
            time.sleep(min(1.5, max(0.0, seconds - (time.monotonic() - begin))))
        sink.close()
        time.sleep(0.2)
        stamps = [stamp for stamp, _ in frames(receiver)]
        arrivals = sorted(receiver.arrivals)
    max_gap, over_2 = _gap_stats(arrivals, rate_hz)
    max_sent_gap, lost_over_2 = _gap_stats(stamps, rate_hz)
    return {"seconds": round(seconds, 1), "rate_hz": rate_hz, "bundles": len(arrivals),
            "bundles_per_s": round((len(arrivals) - 1) / (arrivals[-1] - arrivals[0]), 2),
            "max_arrival_gap_frames": max_gap, "arrival_gaps_over_2_frames": over_2,
            "max_frame_time_gap_frames": max_sent_gap, "frame_time_gaps_over_2_frames": lost_over_2,
            "commands": index}


def test_measure_stream_reports_rate_and_gaps() -> None:
    result = measure_stream(1.0, rate_hz=30.0)
    assert result["bundles"] > 1 and result["max_arrival_gap_frames"] > 0  # it measures; its numbers: BENCHMARKS


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Measure the OSC expression stream's rate and gaps.")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rate-hz", type=float, default=30.0)
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    log.info("%s", json.dumps(measure_stream(arguments.seconds, arguments.rate_hz)))
