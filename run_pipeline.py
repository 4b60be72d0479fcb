#!/usr/bin/env python3
"""Entry point of the emotion pipeline daemon: `python run_pipeline.py [SUBCOMMAND] ...` (see README.md)."""

import sys

from pipeline.tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
