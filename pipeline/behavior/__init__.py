"""Behaviour: turning smoothed emotions into avatar commands (attention, dwell, hysteresis, cooldown, idle), and the rules that map each emotion to an expression and a tone.

Owns: behavior.mapper, behavior.avatar_mapper, behavior.settings (the behavior: section), behavior.lookat (where the avatar looks: the attended face's direction). May import: core."""
