"""Core: the vocabulary every wing shares (frames, detections, scores, observations, commands, camera events), secret masking, the strict settings base, the lazy plugin registry, the repeat limiter for log lines, the kernel names of the pipeline's threads and the freed heap given back to the system.

Owns: core.types, core.redact, core.settings, core.registry, core.logrepeat, core.threads, core.libc, core.heap. May import: nothing of the pipeline (it is the floor)."""
