#!/usr/bin/env python3
"""Entry point of the emotion pipeline daemon: `python run_pipeline.py [SUBCOMMAND] ...` (see README.md).

Signals are set up here, before the heavy imports (NumPy, OpenCV, ONNX Runtime take most of a second): a SIGTERM
(`systemctl stop`) or SIGHUP (`systemctl reload`) in that window would otherwise kill the process by the signal
instead of stopping it cleanly, and a KeyboardInterrupt raised inside an extension module's initialisation breaks
that import (pydantic-core then panics with a traceback). Until the daemon installs its own handlers,
`StartupSignals` only remembers SIGTERM, SIGHUP and SIGINT. Ctrl-C during the imports ends the process quietly with
130 (the shell's code for an interrupt) once they are done; after that, `Daemon._install_signals` takes the signals
over (a stop is honoured at once with exit 0, a SIGHUP has nothing to reload yet), and a one-shot command
(`cli._release_startup_signals`) gets the usual dispositions back, re-raising what arrived (Ctrl-C: 130 again).
"""

import signal
import sys
from types import FrameType

EXIT_INTERRUPTED = 130  # 128 + SIGINT
REMEMBERED = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


class StartupSignals:
    """The SIGTERM/SIGHUP/SIGINT handler of the start-up window: it records and never acts.

    Whoever installs the next handler hands over through `take_pending()` (the daemon) or `release()` (one-shot
    commands); both find this object with `signal.getsignal`, as the handler they replace.
    """

    def __init__(self) -> None:
        self.pending: list[int] = []
        self.originals: dict[int, object] = {}

    def install(self) -> None:
        for signum in REMEMBERED:
            if signal.getsignal(signum) is signal.SIG_IGN:  # e.g. under nohup: an ignored signal stays ignored
                continue
            self.originals[signum] = signal.signal(signum, self)

    def __call__(self, signum: int, _frame: FrameType | None) -> None:
        self.pending.append(signum)

    def take_pending(self) -> list[int]:
        """The signals that arrived so far, in order; the caller now owns them."""
        pending, self.pending = self.pending, []
        return pending

    def release(self) -> None:
        """Give the signals back what they did before, then re-raise what arrived meanwhile."""
        for signum, original in self.originals.items():
            if signal.getsignal(signum) is self:
                signal.signal(signum, original)  # type: ignore[arg-type]
        for signum in self.take_pending():
            signal.raise_signal(signum)


def main() -> int:
    startup = StartupSignals()
    startup.install()  # from here on no KeyboardInterrupt can break the imports below
    from pipeline.tools.cli import main as cli_main

    if signal.SIGINT in startup.pending:
        return EXIT_INTERRUPTED  # Ctrl-C while importing: nothing has started, nothing to report
    try:
        return cli_main()
    except KeyboardInterrupt:  # a one-shot command's Ctrl-C that it does not handle itself
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
