"""The one error every command may raise for bad command-line input: the CLI prints it and exits 2."""


class UsageError(Exception):
    """Bad input named on the command line (exit 2)."""
