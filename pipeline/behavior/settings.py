"""The `behavior:` section: attention, thresholds, timing, and the rule (expression + tone) for each emotion.

Owned by the behaviour wing (`pipeline.behavior.mapper` reads it); the configuration file composes it.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from pipeline.core.settings import PRESET_NAME, ConfigValueError, StrictModel
from pipeline.core.types import EMOTIONS

_NUM = r"\d+(?:\.\d+)?"
_PERCENT = rf"[+-]?{_NUM}%"
_PROSODY: dict[str, tuple[re.Pattern[str], str]] = {
    "pitch": (re.compile(rf"^(?:{_PERCENT}|[+-]{_NUM}(?:st|Hz)|x-low|low|medium|high|x-high|default)$"),
              "a percentage (+5%, -10%, 90%), a signed step or frequency (+2st, -50Hz), "
              "or one of x-low, low, medium, high, x-high, default"),
    "rate": (re.compile(rf"^(?:{_PERCENT}|{_NUM}|x-slow|slow|medium|fast|x-fast|default)$"),
             "a percentage (+5%, -10%, 90%), a plain factor (1.2), "
             "or one of x-slow, slow, medium, fast, x-fast, default"),
    "volume": (re.compile(rf"^(?:{_PERCENT}|[+-]{_NUM}dB|silent|x-soft|soft|medium|loud|x-loud|default)$"),
               "a percentage (+5%, -10%, 90%), a signed decibel change (+6dB, -3dB), "
               "or one of silent, x-soft, soft, medium, loud, x-loud, default"),
}



def prosody_value(name: str, value: object) -> object:
    """`value` checked as an SSML prosody `name` (pitch, rate or volume); a number from YAML (`rate: 1.2`) as text."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = f"{value:g}"
    pattern, forms = _PROSODY[name]
    if not isinstance(value, str) or not pattern.match(value):
        raise ValueError(f"{name} must be {forms}")
    return value

class ExpressionConfig(StrictModel):
    """An avatar facial expression."""

    preset: str = Field(description="VRM 1.0 preset (happy, angry, sad, relaxed, surprised, neutral) or a custom "
                                    "expression name defined on the avatar.")
    weight: float = Field(1.0, ge=0, le=1, description="Expression strength, 0..1.")
    blend_ms: int = Field(300, ge=0, le=10_000, description="Time to blend into the expression, milliseconds.")

    @field_validator("preset")
    @classmethod
    def _check_preset(cls, value: str) -> str:
        """Preset names go into OSC addresses and JSON; keep them to a safe alphabet."""
        if not PRESET_NAME.match(value):
            raise ValueError("must be a non-empty name of letters, digits, '_', '.' or '-'")
        return value


class ToneConfig(StrictModel):
    """How the avatar's voice should sound, in SSML prosody terms."""

    style: str = Field(min_length=1, description="Speaking style, e.g. cheerful, calm, empathetic (TTS style).")
    style_degree: float = Field(1.0, ge=0.01, le=2, description="Intensity of the style, 0.01..2.")
    pitch: str = Field("+0%", description="SSML prosody pitch: +5%, -10%, +2st, -50Hz, or x-low..x-high, default.")
    rate: str = Field("+0%", description="SSML prosody rate: +5%, -10%, a factor like 1.2, or x-slow..x-fast, "
                                         "default.")
    volume: str = Field("+0%", description="SSML prosody volume: +5%, -10%, +6dB, -3dB, or silent, x-soft..x-loud, "
                                           "default.")

    @field_validator("pitch", "rate", "volume", mode="before")
    @classmethod
    def _check_prosody(cls, value: object, info: ValidationInfo) -> object:
        """Validate against SSML prosody forms so the TTS engine never rejects a command at run time."""
        return prosody_value(str(info.field_name), value)


class RuleConfig(StrictModel):
    """What the avatar does in answer to one detected emotion."""

    expression: ExpressionConfig = Field(description="Facial expression the avatar shows.")
    tone: ToneConfig = Field(description="Voice tone the avatar uses.")


def _rule(preset: str, weight: float, style: str, pitch: str = "+0%", rate: str = "+0%",
          volume: str = "+0%") -> RuleConfig:
    return RuleConfig(expression=ExpressionConfig(preset=preset, weight=weight, blend_ms=300),
                      tone=ToneConfig(style=style, pitch=pitch, rate=rate, volume=volume))


def default_rules() -> dict[str, RuleConfig]:
    """The built-in answer to each emotion: mirror positive ones, calm and reassure on negative ones.

    The avatar answers the person rather than copying them: happiness and surprise are mirrored (VRM `happy`,
    `surprised`), sadness is met with a soft `sad` face and an empathetic, slower, quieter voice, and the
    negative-arousal emotions are calmed. VRM 1.0 has no fear or disgust preset (its presets are happy, angry, sad,
    relaxed, surprised, neutral), and mirroring anger or disgust at a visitor would be rude anyway: anger and fear
    get `relaxed` with a calm or reassuring, lower and slower voice, disgust a neutral face with a calm voice.
    A rule may name a custom expression instead (e.g. `fear`) when the avatar defines one.
    """
    return {
        "angry": _rule("relaxed", 0.6, "calm", "-5%", "-10%"),
        "disgust": _rule("neutral", 0.5, "calm"),
        "fear": _rule("relaxed", 0.5, "reassuring", "-5%", "-10%", "-5%"),  # VRM has no fear preset
        "happy": _rule("happy", 0.9, "cheerful", "+5%", "+5%"),
        "sad": _rule("sad", 0.7, "empathetic", "-5%", "-10%", "-10%"),
        "surprise": _rule("surprised", 0.8, "excited", "+10%", "+5%"),
        "neutral": _rule("neutral", 1.0, "friendly"),
    }


def _over_default(default: RuleConfig, given: dict[str, object]) -> dict[str, object]:
    """`given` laid over `default` part by part and field by field: what the rule names wins, the rest is the
    built-in rule's. A part that is not a mapping is left as written, for validation to report."""
    merged = dict(given)
    for part in ("expression", "tone"):
        fields = given.get(part, {})
        if isinstance(fields, dict):
            merged[part] = {**getattr(default, part).model_dump(), **fields}
    return merged


def _check_emotion(name: str) -> str:
    if name not in EMOTIONS:
        raise ValueError(f"unknown emotion {name!r} (allowed: {', '.join(EMOTIONS)})")
    return name


class PresenceConfig(StrictModel):
    """When a face counts as a visitor who arrived, left, or looks at the camera (behavior.presence)."""

    arrive_frames: int = Field(5, ge=1, le=1000, description="A track seen in this many observations is a visitor "
                               "who arrived (a face glimpsed for a frame or two is not a visit).")
    leave_after_s: float = Field(1.5, gt=0, le=600, description="A visitor whose track is not seen for this long "
                                 "has left; its dwell is the time from its first to its last sighting.")
    looking_frames: int = Field(3, ge=1, le=1000, description="A change of whether a visitor looks at the camera "
                                "(the head pose's `looking`) counts once it holds for this many observations.")


class BehaviorConfig(StrictModel):
    """How detected emotions become avatar commands (see `pipeline.behavior.mapper` for the exact rules)."""

    attention: Literal["largest", "center", "all", "room"] = Field(
        "largest",
        description="Whose emotion the avatar answers: largest = the largest face, center = the face nearest the "
                    "frame centre (both sticky: a new face must be clearly larger or closer to take over); all = "
                    "every face, one command stream per track; room = the room mood: one command stream per "
                    "camera (target null) from the mean of all faces' smoothed probabilities, each face weighted "
                    "by its box area.")
    min_confidence: float = Field(0.45, ge=0, le=1, description="Enter threshold: an emotion counts only while it "
                                                                "is the top smoothed emotion with at least this "
                                                                "confidence (and must stay so for dwell_ms).")
    exit_confidence: float = Field(0.35, ge=0, le=1, description="Exit threshold (hysteresis), at most "
                                   "min_confidence: the emotion the avatar shows is kept while its smoothed "
                                   "probability stays at or above this, so no other emotion replaces it until it "
                                   "falls below. Left out, it is 0.35, or min_confidence when that is lower.")
    dwell_ms: float = Field(400.0, ge=0, description="An emotion must hold this long before the avatar reacts.")
    cooldown_ms: float = Field(1500.0, ge=0, description="Minimum time between two commands for the same target.")
    idle_after_s: float = Field(5.0, ge=0, description="With no face for this long, send the neutral (idle) "
                                                       "command; 0 disables it.")
    rules: dict[Annotated[str, AfterValidator(_check_emotion)], RuleConfig] = Field(
        default_factory=default_rules,
        description="Rule per canonical emotion; a rule overrides only what it names (e.g. `sad: {tone: "
                    "{rate: -20%}}` keeps sad's expression and the rest of its tone), the rest and the emotions "
                    "not given keep their built-in rules.")

    presence: PresenceConfig = Field(default_factory=PresenceConfig, description="Visitors arriving, leaving and "
                                     "looking at the camera: `presence` events.")
    on_arrival: RuleConfig | None = Field(None, description="A greeting: when a visitor arrives, the avatar gets "
                                          "this expression and tone once (reason greeting), laid over the happy "
                                          "rule like any rule (e.g. `{tone: {style: friendly}}`); null: no greeting.")
    unwatched_volume: str | None = Field(None, description="Tone follows attention: the SSML volume a command's "
                                         "tone takes when the face it answers does not look at the camera (its "
                                         "head pose), e.g. soft or -6dB; with attention room, when no face looks. "
                                         "null: every rule's own volume.")
    greet_cooldown_s: float = Field(60.0, ge=0, description="At most one greeting per this many seconds per avatar "
                                    "(a group arriving is greeted once).")

    @field_validator("unwatched_volume", mode="before")
    @classmethod
    def _check_unwatched_volume(cls, value: object) -> object:
        return None if value is None else prosody_value("volume", value)

    @field_validator("on_arrival", mode="before")
    @classmethod
    def _greeting_over_happy(cls, value: object) -> object:
        """A greeting given in part keeps the rest of the happy rule, as rules do."""
        return _over_default(default_rules()["happy"], value) if isinstance(value, dict) else value

    @field_validator("rules", mode="before")
    @classmethod
    def _rules_over_defaults(cls, value: object) -> object:
        """An operator who wants a calmer voice for sadness should not have to restate its expression: each rule
        given as a mapping is laid over the built-in rule of its emotion before it is validated."""
        if not isinstance(value, dict):
            return value
        defaults = default_rules()
        return {emotion: _over_default(defaults[emotion], rule)
                if isinstance(rule, dict) and emotion in defaults else rule
                for emotion, rule in value.items()}

    @field_validator("rules")
    @classmethod
    def _merge_defaults(cls, value: dict[str, RuleConfig]) -> dict[str, RuleConfig]:
        """Users override single emotions; the other emotions keep their defaults, so every emotion has a rule."""
        defaults = default_rules()
        return {emotion: value.get(emotion, defaults[emotion]) for emotion in EMOTIONS}

    @model_validator(mode="after")
    def _exit_within_enter(self) -> BehaviorConfig:
        """Hysteresis needs exit <= enter; an unset exit follows a lower min_confidence instead of failing."""
        if self.exit_confidence > self.min_confidence:
            if "exit_confidence" not in self.model_fields_set:
                self.__dict__["exit_confidence"] = self.min_confidence  # frozen model: set the derived default once
            else:
                raise ConfigValueError(f"must not exceed min_confidence ({self.min_confidence:g}): the emotion "
                                       "shown is kept until it falls below exit_confidence, and a new one is taken "
                                       "at min_confidence or above",
                                       key="exit_confidence", value=self.exit_confidence)
        return self

    def rule_presets(self) -> tuple[str, ...]:
        """The expression names the rules use, in emotion order without repeats: the VMC output resets each of them
        in every bundle, so a custom expression (e.g. `fear`) never stays on after another command."""
        return tuple(dict.fromkeys(rule.expression.preset for rule in self.rules.values()))

    def rule_for(self, emotion: str) -> RuleConfig:
        """The rule for `emotion`; unknown labels fall back to neutral's rule."""
        return self.rules.get(emotion) or self.rules["neutral"]
