"""The `avatars:` section's behaviour part: avatars that watch several cameras, and how one is configured.

An avatar has a name, the cameras it watches, an attention policy over all of them and its own behaviour settings
(the top-level `behavior:` keys it names override the top-level ones). Its outputs are composed in by the
configuration file (`pipeline.config.app.AvatarSection`): this wing may not import the outputs wing. The mapper of
an avatar is `pipeline.behavior.avatar_mapper.AvatarMapper`.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from pipeline.behavior.settings import BehaviorConfig
from pipeline.core.settings import ConfigValueError, StrictModel

AVATAR_NAME = re.compile(r"^[a-z0-9_-]{1,64}$")
"""Avatar names go into events, output labels and metrics: 1-64 characters of a-z, 0-9, '_' or '-'."""


class AvatarSettings(StrictModel):
    """One avatar over one or more cameras (see pipeline.behavior.avatar_mapper for attention and stickiness)."""

    name: str = Field(description="Unique avatar name, 1-64 characters of a-z, 0-9, '_' or '-'; commands carry it "
                                  "as `avatar`.")
    cameras: list[str] = Field(min_length=1, description="Names of the cameras this avatar watches; a camera "
                                                         "belongs to at most one avatar.")
    attention: Literal["largest", "center"] = Field(
        "largest", description="Whose face the avatar answers over all its cameras: largest = the largest face "
                               "relative to its frame, center = the face nearest its frame's centre. Sticky: the "
                               "attended face is kept while it is seen; another camera's face takes over only "
                               "once it has not been seen for switch_after_ms.")
    switch_after_ms: float = Field(1000.0, ge=0, description="How long the attended face may go unseen before "
                                                             "attention moves to another face (another camera's "
                                                             "too); like tracking.max_age_s, it rides out missed "
                                                             "detections.")
    behavior: BehaviorConfig = Field(default_factory=BehaviorConfig,
                                     description="The avatar's behaviour: the top-level behavior keys, each "
                                                 "optional; what is given here overrides the top-level value "
                                                 "(rules per emotion). `attention` is the avatar's own key.")

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        """Names key events, output labels and metrics."""
        if not AVATAR_NAME.match(value):
            raise ValueError("must be 1-64 characters of a-z, 0-9, '_' or '-'")
        return value

    @model_validator(mode="after")
    def _attention_is_the_avatars(self) -> AvatarSettings:
        """all/room make no sense for one avatar over several cameras; the avatar's attention is its own key."""
        if "attention" in self.behavior.model_fields_set:
            raise ConfigValueError("an avatar's attention is set by its own `attention:` key (largest or center), "
                                   "not under behavior", key=("behavior", "attention"), value=self.behavior.attention)
        return self


def merge_behavior(top: Any, own: Any) -> Any:
    """The avatar's `behavior:` mapping laid over the top-level one (both as written in the file): each key the
    avatar names wins, rules per emotion. Anything that is not a mapping is returned as written, for validation to
    report; the avatar's attention is its own key, so the top level's (which may be all/room) is not inherited."""
    if not isinstance(own, dict) or not isinstance(top, dict):
        return own
    merged = {k: v for k, v in top.items() if k != "attention"}
    for key, value in own.items():
        if key == "rules" and isinstance(value, dict) and isinstance(merged.get("rules"), dict):
            merged["rules"] = {**merged["rules"], **value}
        else:
            merged[key] = value
    return merged
