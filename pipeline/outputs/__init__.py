"""Outputs: where events go. The event JSON (outputs.events), the Sink role with its bounded queue and thread, one file per output type (stdout, websocket, osc, webhook, mqtt), each declaring its own settings model next to its code, and SSML rendering of a tone.

Owns: outputs.events, outputs.base, outputs.stdout, outputs.websocket, outputs.osc (with outputs.name_sets and outputs.expression_stream), outputs.webhook, outputs.mqtt, outputs.ssml, outputs.history (the recent commands, camera changes and reloads). May import: core."""
