"""Core: the vocabulary every wing shares (frames, detections, scores, observations, commands, camera events), secret masking, the strict settings base and the lazy plugin registry.

Owns: core.types, core.redact, core.settings, core.registry. May import: nothing of the pipeline (it is the floor)."""
