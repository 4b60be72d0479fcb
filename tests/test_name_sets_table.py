"""Issue 26 item 8 (b): every expression of every name set against its intended table, written out here.

The tables below are the specification, not a copy of `pipeline.outputs.name_sets`: each ARKit entry is the facial
action units of the expression (FACS) in ARKit's blendshapes, each VRM 0.x entry the VRM 0.x clip that VRM 1.0's
preset was renamed from (or the nearest, where 0.x has none). Before this test, a sad face that smiled (ARKit `sad`
→ `mouthSmile*`) passed every test: only a few names of a few entries were checked.
"""

from __future__ import annotations

import pytest

from pipeline.core.types import EMOTIONS
from pipeline.outputs.name_sets import EXPRESSION_KEYS, VRM1_PRESETS, NameSet

# The 52 ARKit blendshapes (Apple's ARFaceAnchor.BlendShapeLocation), as Perfect Sync and Live Link Face name them.
ARKIT_NAMES = frozenset({
    "browDownLeft", "browDownRight", "browInnerUp", "browOuterUpLeft", "browOuterUpRight",
    "cheekPuff", "cheekSquintLeft", "cheekSquintRight",
    "eyeBlinkLeft", "eyeBlinkRight", "eyeLookDownLeft", "eyeLookDownRight", "eyeLookInLeft", "eyeLookInRight",
    "eyeLookOutLeft", "eyeLookOutRight", "eyeLookUpLeft", "eyeLookUpRight", "eyeSquintLeft", "eyeSquintRight",
    "eyeWideLeft", "eyeWideRight",
    "jawForward", "jawLeft", "jawOpen", "jawRight",
    "mouthClose", "mouthDimpleLeft", "mouthDimpleRight", "mouthFrownLeft", "mouthFrownRight", "mouthFunnel",
    "mouthLeft", "mouthLowerDownLeft", "mouthLowerDownRight", "mouthPressLeft", "mouthPressRight", "mouthPucker",
    "mouthRight", "mouthRollLower", "mouthRollUpper", "mouthShrugLower", "mouthShrugUpper", "mouthSmileLeft",
    "mouthSmileRight", "mouthStretchLeft", "mouthStretchRight", "mouthUpperUpLeft", "mouthUpperUpRight",
    "noseSneerLeft", "noseSneerRight", "tongueOut",
})

# Expression key → {blendshape: weight} at the rule's weight 1.0.
ARKIT_TABLE: dict[str, dict[str, float]] = {
    # AU6 cheek raiser + AU12 lip corner puller: a Duchenne smile
    "happy": {"cheekSquintLeft": 0.7, "cheekSquintRight": 0.7, "eyeSquintLeft": 0.3, "eyeSquintRight": 0.3,
              "mouthSmileLeft": 1.0, "mouthSmileRight": 1.0},
    # AU1 inner brow raiser + AU4 brow lowerer + AU15 lip corner depressor: the corners go DOWN
    "sad": {"browInnerUp": 0.8, "browDownLeft": 0.3, "browDownRight": 0.3,
            "mouthFrownLeft": 0.8, "mouthFrownRight": 0.8},
    # AU1 + AU2 outer brow raiser + AU5 upper lid raiser + AU26 jaw drop
    "surprise": {"browInnerUp": 1.0, "browOuterUpLeft": 1.0, "browOuterUpRight": 1.0,
                 "eyeWideLeft": 0.8, "eyeWideRight": 0.8, "jawOpen": 0.6},
    # AU1 + AU2 + AU4 + AU5 + AU7 lid tightener + AU20 lip stretcher + AU26
    "fear": {"browInnerUp": 1.0, "browOuterUpLeft": 0.5, "browOuterUpRight": 0.5,
             "browDownLeft": 0.4, "browDownRight": 0.4, "eyeWideLeft": 0.8, "eyeWideRight": 0.8,
             "eyeSquintLeft": 0.2, "eyeSquintRight": 0.2, "mouthStretchLeft": 0.7, "mouthStretchRight": 0.7,
             "jawOpen": 0.3},
    # AU4 + AU5 + AU7 + AU23 lip tightener (ARKit's nearest: mouthPress)
    "angry": {"browDownLeft": 1.0, "browDownRight": 1.0, "eyeWideLeft": 0.3, "eyeWideRight": 0.3,
              "eyeSquintLeft": 0.5, "eyeSquintRight": 0.5, "mouthPressLeft": 0.7, "mouthPressRight": 0.7},
    # AU9 nose wrinkler + AU15 + AU16 lower lip depressor
    "disgust": {"noseSneerLeft": 1.0, "noseSneerRight": 1.0, "mouthFrownLeft": 0.5, "mouthFrownRight": 0.5,
                "mouthLowerDownLeft": 0.4, "mouthLowerDownRight": 0.4},
    # VRM's relaxed: a soft smile, a little cheek, lids slightly lowered
    "relaxed": {"mouthSmileLeft": 0.4, "mouthSmileRight": 0.4, "cheekSquintLeft": 0.2, "cheekSquintRight": 0.2,
                "eyeBlinkLeft": 0.2, "eyeBlinkRight": 0.2},
    "neutral": {},  # every shape at rest
}

# VRM 0.x clips: Joy, Angry, Sorrow, Fun, Neutral (VRM 1.0 renamed them happy, angry, sad, relaxed, neutral).
VRM0_TABLE: dict[str, dict[str, float]] = {
    "happy": {"Joy": 1.0},
    "angry": {"Angry": 1.0},
    "sad": {"Sorrow": 1.0},
    "relaxed": {"Fun": 1.0},
    "neutral": {"Neutral": 1.0},
    "surprise": {"Joy": 1.0},  # no surprised clip in 0.x: mirrored as excitement, as the default rule does
    "fear": {"Sorrow": 1.0},  # nearest of the five (raised inner brows)
    "disgust": {"Angry": 1.0},  # nearest of the five (a rejecting face)
}

# VRM 1.0: the rules already speak its presets, so each goes out under its own name; a name that is no VRM 1.0
# preset (fear, disgust, surprise spelt as the emotion) is the avatar's custom expression, also as it is.
VRM1_TABLE: dict[str, dict[str, float]] = {
    **{preset: {preset: 1.0} for preset in ("happy", "angry", "sad", "relaxed", "surprised", "neutral")},
    **{name: {name: 1.0} for name in ("fear", "disgust", "surprise")},
}

TABLES = {"arkit": ARKIT_TABLE, "vrm0": VRM0_TABLE, "vrm1": VRM1_TABLE}
WEIGHTS = (1.0, 0.5, 0.0)


def _presets(kind: str) -> list[str]:
    """Every preset a rule may send for an expression key: the key, and VRM 1.0's `surprised` for `surprise`."""
    return [*TABLES[kind], *(["surprised"] if "surprise" in TABLES[kind] and kind != "vrm1" else [])]


def test_the_tables_cover_every_expression_key_and_vrm1_preset() -> None:
    assert len(ARKIT_NAMES) == 52
    assert set(EXPRESSION_KEYS) == {*EMOTIONS, "relaxed"}
    for kind in ("arkit", "vrm0"):
        assert set(TABLES[kind]) == set(EXPRESSION_KEYS), kind
    assert set(VRM1_PRESETS) <= set(VRM1_TABLE)


@pytest.mark.parametrize("kind", sorted(TABLES))
@pytest.mark.parametrize("weight", WEIGHTS)
def test_every_expression_gives_exactly_its_table_entry_scaled(kind: str, weight: float) -> None:
    names = NameSet(kind)  # type: ignore[arg-type]
    for preset in _presets(kind):
        key = "surprise" if preset == "surprised" and kind != "vrm1" else preset
        expected = {name: pytest.approx(value * weight) for name, value in TABLES[kind][key].items()}
        assert names.weights(preset, weight) == expected, (kind, preset)


@pytest.mark.parametrize("kind", sorted(TABLES))
def test_names_lists_every_name_the_set_sends(kind: str) -> None:
    """The stream sends every listed name in each bundle (zeros included), so a name missing here never resets."""
    names = NameSet(kind)  # type: ignore[arg-type]
    sent = {name for preset in _presets(kind) for name in names.weights(preset, 1.0)}
    listed = names.names(_presets(kind))
    assert len(listed) == len(set(listed)) and sent <= set(listed)
    if kind == "vrm0":
        assert listed[:5] == ["Joy", "Angry", "Sorrow", "Fun", "Neutral"]
    if kind == "vrm1":
        assert listed[:6] == list(VRM1_PRESETS)
    if kind == "arkit":
        assert set(listed) <= ARKIT_NAMES and "happy" not in listed  # no VRM name leaks into an ARKit avatar


def test_arkit_entries_mean_their_expression() -> None:
    """What each ARKit entry must mean whatever its exact weights: a glance at the face, written as rules."""
    for key, entry in ARKIT_TABLE.items():
        assert set(entry) <= ARKIT_NAMES, key
        for name, value in entry.items():  # bilateral shapes move both sides alike
            if name.endswith("Left"):
                assert entry[name.removesuffix("Left") + "Right"] == value, (key, name)
    smiles = {"mouthSmileLeft", "mouthSmileRight"}
    frowns = {"mouthFrownLeft", "mouthFrownRight"}
    arkit = NameSet("arkit")
    for key in ("happy", "relaxed"):
        assert smiles <= set(arkit.weights(key, 1.0)) and not frowns & set(arkit.weights(key, 1.0)), key
    for key in ("sad", "disgust"):
        assert frowns <= set(arkit.weights(key, 1.0)) and not smiles & set(arkit.weights(key, 1.0)), key
    for key in ("sad", "surprise", "fear"):
        assert arkit.weights(key, 1.0)["browInnerUp"] > 0, key
    assert {"browDownLeft", "browDownRight"} <= set(arkit.weights("angry", 1.0))
    assert {"noseSneerLeft", "noseSneerRight"} <= set(arkit.weights("disgust", 1.0))
    assert arkit.weights("neutral", 1.0) == {}
