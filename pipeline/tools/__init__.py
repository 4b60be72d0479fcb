"""Tools: the command line (run, check-config, prepare-models, analyze, build-engine, bench) and the measurement commands behind analyze and bench.

Owns: tools.cli, tools.analyze, tools.probe (check-config's warnings and --probe), tools.bench*. May import: every other wing (it is the top)."""
