"""Behaviour: turning smoothed emotions into avatar commands (attention, dwell, hysteresis, cooldown, idle), and the rules that map each emotion to an expression and a tone.

Owns: behavior.mapper, behavior.settings (the behavior: section). May import: core."""
