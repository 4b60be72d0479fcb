"""Inference backends, chosen by `inference.backend` through the registry in base.py."""
