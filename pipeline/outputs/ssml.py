"""A command's tone as SSML, for text-to-speech integrators.

`tone_to_ssml(tone, "Hello!")` wraps the text the avatar is about to say in the command's voice tone:

```xml
<speak version="1.0" xmlns="http://www.w3.org/2001/10/synthesis"
       xmlns:mstts="https://www.w3.org/2001/mstts" xml:lang="en-US">
  <voice name="en-US-JennyNeural">                                   (only when a voice is given)
    <mstts:express-as style="cheerful" styledegree="1">              (only when the tone has a style)
      <prosody pitch="+5%" rate="+5%" volume="+0%">Hello!</prosody>
    </mstts:express-as>
  </voice>
</speak>
```

`<prosody>` is standard SSML 1.1 (`pitch`, `rate`, `volume` are validated in that syntax by the config).
`<mstts:express-as>` is Azure Speech's extension for speaking styles (namespace `https://www.w3.org/2001/mstts`,
`styledegree` 0.01-2); Azure applies it only inside a `<voice>` of a neural voice that supports the style, and other
engines that do not know the namespace ignore or reject it, so leave the style out (an empty `style`) for them.
The text is XML-escaped, so user text cannot break the markup. The output is one line, without an XML declaration.
"""

from __future__ import annotations

from typing import Protocol
from xml.sax.saxutils import escape, quoteattr

SSML_NS = "http://www.w3.org/2001/10/synthesis"
MSTTS_NS = "https://www.w3.org/2001/mstts"


class ToneLike(Protocol):
    """`pipeline.core.types.Tone` or `pipeline.behavior.settings.ToneConfig`: both carry these attributes."""

    @property
    def style(self) -> str: ...
    @property
    def style_degree(self) -> float: ...
    @property
    def pitch(self) -> str: ...
    @property
    def rate(self) -> str: ...
    @property
    def volume(self) -> str: ...


def tone_to_ssml(tone: ToneLike, text: str, voice: str | None = None, lang: str = "en-US") -> str:
    """`text` as an SSML `<speak>` document spoken in `tone` (see the module docstring for the shape)."""
    prosody = (f"<prosody pitch={quoteattr(tone.pitch)} rate={quoteattr(tone.rate)} "
               f"volume={quoteattr(tone.volume)}>{escape(text)}</prosody>")
    body = prosody
    if tone.style:
        body = (f"<mstts:express-as style={quoteattr(tone.style)} styledegree=\"{tone.style_degree:g}\">"
                f"{body}</mstts:express-as>")
    if voice:
        body = f"<voice name={quoteattr(voice)}>{body}</voice>"
    return (f"<speak version=\"1.0\" xmlns=\"{SSML_NS}\" xmlns:mstts=\"{MSTTS_NS}\" xml:lang={quoteattr(lang)}>"
            f"{body}</speak>")
