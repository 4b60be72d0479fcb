"""A test command for one avatar (or camera stream): "does the avatar move?" without a visitor in front of a camera.

Why: after wiring an avatar app an operator's first question is whether it receives anything. The status page's "send
test expression" and `python run_pipeline.py send-test` build the very command the behaviour rules would send for an
emotion (its expression preset and weight, its tone), marked `reason: "test"`, and publish it to that stream's
outputs; after `hold_s` the stream gets its neutral rule again, so the avatar does not keep a test face.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from pipeline.behavior.settings import BehaviorConfig
from pipeline.config.app import AppConfig, load_config
from pipeline.core.types import Command, Expression, Tone
from pipeline.outputs.base import EventBus
from pipeline.outputs.events import command_event
from pipeline.outputs.websocket import EventHub
from pipeline.service.lifecycle import close_sinks
from pipeline.service.parts import open_all_sinks

log = logging.getLogger(__name__)

HOLD_S = 3.0  # how long a test expression stays before the stream returns to neutral
CLOSE_S = 2.0


class UnknownStream(ValueError):
    """No avatar or camera stream of that name, or no such emotion or expression."""


def streams(cfg: AppConfig) -> list[str]:
    """Every stream a test can go to: each avatar, then each enabled camera in no avatar."""
    in_avatars = {camera for avatar in cfg.avatars for camera in avatar.cameras}
    return [*(a.name for a in cfg.avatars), *(c.name for c in cfg.cameras if c.enabled and c.name not in in_avatars)]


def trial_command(cfg: AppConfig, stream: str, expression: str, weight: float | None = None) -> Command:
    """The command the rules of `stream` give `expression` (an emotion: its rule; else an expression preset at
    `weight`, default 1, with the neutral rule's tone), marked as a test."""
    avatar = next((a for a in cfg.avatars if a.name == stream), None)
    if avatar is None and stream not in streams(cfg):
        raise UnknownStream(f"no avatar or camera stream named {stream!r}; there are: {', '.join(streams(cfg))}")
    behavior: BehaviorConfig = avatar.behavior if avatar is not None else cfg.behavior
    rule = behavior.rules.get(expression)
    neutral = behavior.rules["neutral"]
    if rule is not None:
        preset, strength, blend = rule.expression.preset, rule.expression.weight, rule.expression.blend_ms
        tone = rule.tone
    else:
        known = {r.expression.preset for r in behavior.rules.values()}
        if not expression.replace("_", "").isalnum():
            raise UnknownStream(f"{expression!r} is not an emotion or an expression name; emotions: "
                                f"{', '.join(behavior.rules)}; expressions the rules use: {', '.join(sorted(known))}")
        preset, strength, blend, tone = expression, 1.0, neutral.expression.blend_ms, neutral.tone
    camera = avatar.cameras[0] if avatar is not None else stream
    return Command(camera=camera, ts=time.time(), target=None, emotion=expression if rule else "neutral",
                   confidence=1.0, reason="test", avatar=avatar.name if avatar is not None else None,
                   expression=Expression(preset, float(weight if weight is not None else strength), int(blend)),
                   tone=Tone(tone.style, tone.pitch, tone.rate, tone.volume, tone.style_degree))


def send_trial(cfg: AppConfig, publish: Callable[[Command], None], stream: str, expression: str,
              weight: float | None = None, hold_s: float = HOLD_S, wait: bool = False) -> Command:
    """Publish the test command now and the stream's neutral command after `hold_s` (on a timer, or before
    returning when `wait`)."""
    command = trial_command(cfg, stream, expression, weight)
    publish(command)
    back = trial_command(cfg, stream, "neutral")
    if wait:
        time.sleep(hold_s)
        publish(back)
    else:
        timer = threading.Timer(hold_s, publish, args=(back,))
        timer.daemon = True
        timer.start()
    return command


def send_trial_from_config(path: Path, stream: str | None, expression: str, weight: float | None,
                          hold_s: float) -> list[str]:
    """`send-test`: open the configuration's outputs (no camera, no model, no server), send the test command to one
    stream (default: the first), hold it, return to neutral, close. Returns the outputs it went to."""
    cfg = load_config(path)
    names = streams(cfg)
    chosen = stream or (names[0] if names else "")
    sinks = open_all_sinks(cfg, EventHub(), CLOSE_S)
    try:
        bus = EventBus(sinks)
        send_trial(cfg, lambda c: bus.publish(command_event(c)), chosen, expression, weight, hold_s, wait=True)
        reached = [sink.target for sink in sinks if sink.route is None
                   or sink.route.avatar == chosen]
    finally:
        close_sinks(sinks, CLOSE_S)
    return reached
