"""Name sets of the OSC output: a command's expression (preset + weight) → {blendshape name: weight}.

Avatars disagree on what their expressions are called: VRM 1.0 models have `happy … neutral`, VRM 0.x models
`Joy, Angry, Sorrow, Fun, Neutral`, ARKit-rigged models (Perfect Sync, Live Link Face) the 52 ARKit blendshapes,
and anything else whatever its author chose. The behaviour rules speak VRM 1.0 (their `expression.preset`), so each
set translates the expression the rule chose, never the detected emotion: a rule that answers anger with `relaxed`
keeps doing so in every set.

The table key of an expression is its preset read as an emotion: `surprised` → `surprise`, the VRM 1.0 presets and
the seven emotions as themselves (a rule may name `fear` or `disgust`), plus `relaxed`. A preset a set does not know
(a custom expression the avatar defines) is sent under its own name at the rule's weight, as before name sets; an
expression key that `custom_names` leaves out is the face at rest (every name at 0).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal

from pipeline.core.types import EMOTIONS

NameSetName = Literal["vrm1", "vrm0", "arkit", "custom"]

VRM1_PRESETS: tuple[str, ...] = ("happy", "angry", "sad", "relaxed", "surprised", "neutral")
"""The VRM 1.0 emotion expression presets, in the order they are sent."""

EXPRESSION_KEYS: tuple[str, ...] = (*EMOTIONS, "relaxed")
"""What a table (and `custom_names`) is keyed by: the seven emotions and VRM's `relaxed`."""

_ALIASES = {"surprised": "surprise"}

VRM0: dict[str, dict[str, float]] = {
    "happy": {"Joy": 1.0},
    "angry": {"Angry": 1.0},
    "sad": {"Sorrow": 1.0},
    "relaxed": {"Fun": 1.0},  # VRM 1.0 renamed Fun to relaxed
    "neutral": {"Neutral": 1.0},
    "surprise": {"Joy": 1.0},  # VRM 0.x has no surprised clip; the default rule mirrors surprise as excitement
    "fear": {"Sorrow": 1.0},  # shares AU1+AU4 (raised inner, lowered brows) with sadness
    "disgust": {"Angry": 1.0},  # a rejecting face; the nearest of the five to AU9 (nose wrinkler)
}
VRM0_NAMES: tuple[str, ...] = ("Joy", "Angry", "Sorrow", "Fun", "Neutral")


def _both(side_name: str, weight: float) -> dict[str, float]:
    """`browDown` → browDownLeft and browDownRight, the way ARKit splits bilateral shapes."""
    return {f"{side_name}Left": weight, f"{side_name}Right": weight}


ARKIT: dict[str, dict[str, float]] = {
    # AU6 cheek raiser + AU12 lip corner puller (Duchenne smile)
    "happy": {**_both("cheekSquint", 0.7), **_both("eyeSquint", 0.3), **_both("mouthSmile", 1.0)},
    # AU1 inner brow raiser + AU4 brow lowerer + AU15 lip corner depressor
    "sad": {"browInnerUp": 0.8, **_both("browDown", 0.3), **_both("mouthFrown", 0.8)},
    # AU1 + AU2 outer brow raiser + AU5 upper lid raiser + AU26 jaw drop
    "surprise": {"browInnerUp": 1.0, **_both("browOuterUp", 1.0), **_both("eyeWide", 0.8), "jawOpen": 0.6},
    # AU1 + AU2 + AU4 + AU5 + AU7 lid tightener + AU20 lip stretcher + AU26
    "fear": {"browInnerUp": 1.0, **_both("browOuterUp", 0.5), **_both("browDown", 0.4), **_both("eyeWide", 0.8),
             **_both("eyeSquint", 0.2), **_both("mouthStretch", 0.7), "jawOpen": 0.3},
    # AU4 + AU5 + AU7 + AU23 lip tightener
    "angry": {**_both("browDown", 1.0), **_both("eyeWide", 0.3), **_both("eyeSquint", 0.5),
              **_both("mouthPress", 0.7)},
    # AU9 nose wrinkler + AU15 + AU16 lower lip depressor
    "disgust": {**_both("noseSneer", 1.0), **_both("mouthFrown", 0.5), **_both("mouthLowerDown", 0.4)},
    # VRM relaxed: a soft AU12 with a little AU6, lids slightly lowered (AU43 in part)
    "relaxed": {**_both("mouthSmile", 0.4), **_both("cheekSquint", 0.2), **_both("eyeBlink", 0.2)},
    "neutral": {},  # every shape at rest
}


def expression_key(preset: str) -> str:
    """The table key of a rule's preset (`surprised` → `surprise`); other names as they are."""
    return _ALIASES.get(preset, preset)


class NameSet:
    """Translates expressions for one output; `names()` lists every name it may ever set, in sending order."""

    def __init__(self, kind: NameSetName, custom: Mapping[str, Mapping[str, float]] | None = None) -> None:
        self.kind = kind
        tables: dict[str, Mapping[str, Mapping[str, float]]] = {"vrm1": {}, "vrm0": VRM0, "arkit": ARKIT,
                                                                 "custom": custom or {}}
        self.table = tables[kind]

    def weights(self, preset: str, weight: float) -> dict[str, float]:
        """{name: weight} for the expression `preset` at `weight` (the table's weights scaled by it)."""
        key = expression_key(preset)
        entry = self.table.get(key)
        if entry is None and self.kind in ("arkit", "custom") and key in EXPRESSION_KEYS:
            entry = {}  # an emotion the set leaves out: the face at rest, never a VRM name it may not have
        if entry is None:
            return {preset: weight}
        return {name: value * weight for name, value in entry.items()}

    def names(self, presets: Iterable[str] = ()) -> list[str]:
        """The names this set sends: its own (VRM 1.0 presets for vrm1), then those `presets` translate to."""
        base: list[str] = {"vrm1": list(VRM1_PRESETS), "vrm0": list(VRM0_NAMES)}.get(self.kind, [])
        for entry in self.table.values():
            base.extend(entry)
        for preset in presets:
            base.extend(self.weights(preset, 1.0))
        return list(dict.fromkeys(base))
