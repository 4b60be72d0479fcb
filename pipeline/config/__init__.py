"""Configuration: the whole YAML file. Composes the section models that each wing declares (cameras from capture, models and inference from inference, behaviour, outputs) with the daemon's own sections (tracking, server, logging), loads YAML with line marks and ${VAR} substitution, and formats every error as FILE:LINE: key: message.

Owns: config.app, config.loader, config.credentials, config.schema (the JSON Schema and key reference generated from the models). May import: capture, inference, behavior, outputs, core (their settings modules only)."""
