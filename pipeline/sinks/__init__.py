"""Event outputs, chosen by each `outputs[].type` through the registry in base.py."""
