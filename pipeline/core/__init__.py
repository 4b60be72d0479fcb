"""Core: the vocabulary every wing shares (frames, detections, scores, observations, commands, camera events), secret masking, the strict settings base, the lazy plugin registry and the repeat limiter for log lines.

Owns: core.types, core.redact, core.settings, core.registry, core.logrepeat. May import: nothing of the pipeline (it is the floor)."""
