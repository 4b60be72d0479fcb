"""Command line: `run` (default), `check-config`, `prepare-models`, `build-engine`, `analyze`, `bench`.

Exit codes (SPEC.md): 0 ok; 1 runtime failure; 2 bad config, usage or input; 3 model or engine problem.
No traceback reaches an operator for a foreseeable problem: each is caught here and printed as one clear line.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

from pipeline.config.app import AppConfig, ConfigError, load_config, summarize
from pipeline.inference.backend import BackendError
from pipeline.modelprep.manifest import ManifestError
from pipeline.modelprep.prepare import ModelError
from pipeline.service.logs import setup_logging
from pipeline.tools.usage import UsageError

log = logging.getLogger("pipeline")

EXIT_OK, EXIT_RUNTIME, EXIT_CONFIG, EXIT_MODEL = 0, 1, 2, 3
PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = PROJECT_ROOT / "config" / "default.yaml"
MODEL_ERRORS = (ModelError, BackendError, ManifestError)


def _load(path: Path) -> AppConfig:
    from pipeline.config.credentials import export_credentials

    export_credentials()  # systemd LoadCredential= files become ${VAR}s (no-op outside systemd)
    return load_config(path)


def cmd_run(args: argparse.Namespace) -> int:
    from pipeline.service.daemon import Daemon
    from pipeline.service.server import ServerStartError

    cfg = _load(args.config)
    setup_logging(args.log_level or cfg.logging.level, cfg.logging.format)
    daemon = Daemon(cfg, config_path=args.config, log_level=args.log_level)
    try:
        daemon.start()
    except ServerStartError as exc:  # e.g. port in use: one line, no traceback
        daemon.stop()
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_RUNTIME
    except BaseException:
        daemon.stop()
        raise
    return daemon.run(args.duration)


def cmd_check_config(args: argparse.Namespace) -> int:
    """Validate the file (exit 2 on any error); then look at this machine: quickly (warnings, exit 0), or with
    --probe by opening each camera and model once (each failure an error, exit 2). See pipeline.tools.probe."""
    from pipeline.tools.probe import probe_config, quick_findings

    cfg = _load(args.path)
    print(f"{args.path}: valid")
    print(summarize(cfg))
    if not args.probe:
        warnings = quick_findings(cfg)
        for finding in warnings:
            print(finding.format(args.path, "warning"), file=sys.stderr)
        if warnings:
            print(f"{args.path}: the file is valid; the warnings are about this machine (check-config --probe "
                  "opens each camera and model once)", file=sys.stderr)
        return EXIT_OK
    report = probe_config(cfg, args.timeout)
    for finding in report.passed:
        print(finding.format(args.path))
    for finding in report.failures:
        print(finding.format(args.path), file=sys.stderr)
    if report.failures:
        parts = []
        if report.fatal:
            parts.append(f"{len(report.fatal)} problem(s) that would stop the daemon here")
        if report.retried:
            parts.append(f"{len(report.retried)} camera(s) it could not open (the daemon would start and keep "
                         f"retrying them)")
        print(f"{args.path}: probe: {'; '.join(parts)}", file=sys.stderr)
        return EXIT_CONFIG
    print(f"{args.path}: probe: every camera and model opened")
    return EXIT_OK


def cmd_prepare_models(args: argparse.Namespace) -> int:
    from pipeline.modelprep.manifest import load_manifest
    from pipeline.modelprep.prepare import prepare_model

    precisions = [p.strip() for p in args.precision.split(",") if p.strip()]
    bad = [p for p in precisions if p not in ("fp32", "fp16", "int8")]
    if bad:
        raise UsageError(f"--precision: unknown {', '.join(bad)} (choose from fp32, fp16, int8)")
    if args.triton_queue_delay_us < 0:
        raise UsageError(f"--triton-queue-delay-us: {args.triton_queue_delay_us} is negative")
    if args.triton_repo is not None and len(precisions) != 1:
        raise UsageError("--triton-repo: give one --precision (the repository serves each model in one precision)")
    cfg = _load(args.config)
    names = args.model or [cfg.detector.model, cfg.emotion.model]
    for name in names:
        for path in prepare_model(load_manifest(name), precisions, args.calib, force=args.force):  # type: ignore[arg-type]
            print(path)
    if args.triton_repo is not None:
        _write_triton_repo(args.triton_repo, names, precisions[0], cfg.inference.max_batch,
                           args.triton_queue_delay_us)
    return EXIT_OK


def _write_triton_repo(repo: Path, names: Sequence[str], precision: str, max_batch: int,
                       queue_delay_us: int = 0) -> None:
    """`--triton-repo DIR`: the prepared models as a Triton model repository, each under its own name (what the
    `triton` backend asks for unless inference.triton.models maps it), in the precision each actually runs in."""
    from pipeline.modelprep.manifest import load_manifest
    from pipeline.modelprep.prepare import ensure_model
    from pipeline.modelprep.triton_repo import TritonRepoError, write_triton_repository

    models = []
    for name in names:
        manifest = load_manifest(name)
        models.append((name, ensure_model(manifest, manifest.effective_precision(precision))))  # type: ignore[arg-type]
    try:
        folders = write_triton_repository(repo, models, max_batch, queue_delay_us=queue_delay_us)
    except (TritonRepoError, OSError) as exc:
        raise ModelError(f"--triton-repo {repo}: {exc}") from exc
    for folder in folders:
        print(folder / "config.pbtxt")


def cmd_build_engine(args: argparse.Namespace) -> int:
    from pipeline.inference.gpu.engine_build import build_for_cli, require_gpu_packages
    from pipeline.modelprep.manifest import load_manifest
    from pipeline.modelprep.prepare import ensure_model

    require_gpu_packages()  # before anything slow: without TensorRT and cuda-python there is nothing to build with
    cfg = _load(args.config)
    precision = args.precision or cfg.inference.precision
    if precision not in ("fp32", "fp16", "int8"):
        raise UsageError(f"--precision: unknown {precision} (choose from fp32, fp16, int8)")
    max_batch = args.max_batch or cfg.inference.max_batch
    if not 1 <= max_batch <= 1024:
        raise UsageError(f"--max-batch: {max_batch} is outside 1..1024")
    input_size = args.input_size or cfg.detector.input_size
    for name in args.model or [cfg.detector.model, cfg.emotion.model]:
        manifest = load_manifest(name)
        onnx_path = ensure_model(manifest, precision)
        result = build_for_cli(manifest, onnx_path, precision, max_batch, input_size, force=args.force,
                               workspace_bytes=cfg.inference.tensorrt.workspace_mb << 20)
        state = "built" if result.built else "up to date"
        print(f"{result.engine} ({state})")
    return EXIT_OK


def cmd_analyze(args: argparse.Namespace) -> int:
    from pipeline.tools.analyze import run_analyze

    cfg = _load(args.config)
    return run_analyze(cfg, args.paths, every=args.every, cropped=args.cropped, crop=args.crop,
                       detector_input=args.detector_input, only_holdout=args.holdout,
                       summary_form=args.summary_form)


def cmd_bench(args: argparse.Namespace) -> int:
    from pipeline.tools.bench import run_bench

    return run_bench(args)


ANALYZE_DESCRIPTION = """\
Images, folders or videos -> one JSON line per image or frame on stdout; warnings and the summary on stderr: a
table when stderr is a terminal (and a progress bar), else one `summary: {JSON}` line. Exit 2 when an input is
missing or unreadable."""

ANALYZE_EXAMPLES = """\
examples:
  run_pipeline.py analyze photo.jpg                         # faces and emotions of one photo
  run_pipeline.py analyze clip.mp4 --every 5 > clip.jsonl   # every 5th frame of a video
  run_pipeline.py analyze dataset/                          # dataset/<emotion>/*.jpg: accuracy in the summary
  run_pipeline.py analyze --cropped fer2013/                # images that are already face crops (no detector)
  run_pipeline.py analyze --cropped --holdout fer2013_train_jpeg.npz  # a model's figures on the training hold-out
  run_pipeline.py analyze clip.mp4 --detector-input 320x192 # faster, finds fewer small faces (default: auto)"""

BENCH_EXAMPLES = """\
examples:
  run_pipeline.py bench pipeline                            # 4 demo cameras: batched vs naive
  run_pipeline.py bench pipeline --video clip.mp4 --cameras 8 --fps 15 --json p.json --plot p.png
  run_pipeline.py bench analyze --video clip.mp4 --repeat 3
  run_pipeline.py bench engine --model emotion --batch 1,8,32
  run_pipeline.py bench capture --video clip.mp4 --cameras 4
  run_pipeline.py bench soak --rtsp-server clip.mp4           # 40 min: memory with a reconnect every 5 min
  run_pipeline.py bench MODE --help                         # the options of one mode"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="run_pipeline.py", description=__doc__.splitlines()[0])
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default=None,
                        help="override logging.level of the config")
    from pipeline import __version__

    parser.add_argument("--version", action="version", version=f"emotion-pipeline {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser("run", parents=[common], help="run the daemon (default)")
    _add_run_args(run)

    check = sub.add_parser("check-config", parents=[common], help="validate a config file without starting anything")
    check.add_argument("path", type=Path, help="the YAML config file to validate")
    check.add_argument("--probe", action="store_true",
                       help="also open each enabled camera once (reading one frame) and load each model in the "
                            "configured backend, device and precision; any failure exits 2")
    check.add_argument("--timeout", type=float, default=12.0, metavar="S",
                       help="--probe: seconds to wait for the cameras, opened all at once (default 12)")

    schema = sub.add_parser("schema", parents=[common],
                            help="print the configuration's JSON Schema (for editors), or write it and the key "
                                 "reference")
    schema.add_argument("--output", type=Path, default=None, metavar="FILE",
                        help="write the JSON Schema here instead of stdout (the repository's copy: config/schema.json)")
    schema.add_argument("--markdown", type=Path, default=None, metavar="FILE",
                        help="also write the key reference as Markdown (the repository's copy: docs/config.md)")

    trial = sub.add_parser("send-test", parents=[common],
                           help="send one test expression to an avatar's outputs (no camera, no model), then neutral")
    trial.add_argument("--config", type=Path, default=DEFAULT_CONFIG, metavar="PATH",
                       help="YAML config whose outputs and rules are used (default: config/default.yaml)")
    trial.add_argument("--expression", default="happy",
                       help="an emotion (its rule's expression and tone: happy, sad, angry, surprise, fear, disgust, "
                            "neutral) or an expression name at --weight (default happy)")
    trial.add_argument("--avatar", default=None, metavar="NAME",
                       help="the avatar (or camera in no avatar) whose outputs get it (default: the first)")
    trial.add_argument("--weight", type=float, default=None, help="the expression's weight, 0..1 (default: the rule's)")
    trial.add_argument("--hold-s", type=float, default=3.0, help="seconds before neutral is sent (default 3)")

    prep = sub.add_parser("prepare-models", parents=[common], help="obtain, convert and verify the models into models/")
    prep.add_argument("--precision", default="fp32", help="comma-separated: fp32,fp16,int8 (default fp32)")
    prep.add_argument("--calib", type=Path, default=None, help="folder of face images for int8 calibration")
    prep.add_argument("--model", action="append", help="model name (default: the config's detector and emotion)")
    prep.add_argument("--config", type=Path, default=DEFAULT_CONFIG, metavar="PATH",
                      help="YAML config naming the detector and emotion models (default: config/default.yaml)")
    prep.add_argument("--force", action="store_true", help="rebuild even if valid files exist")
    prep.add_argument("--triton-repo", type=Path, default=None, metavar="DIR",
                      help="also write a Triton model repository into DIR (config.pbtxt for the onnxruntime_onnx "
                           "platform and 1/model.onnx per model, max_batch_size from inference.max_batch)")
    prep.add_argument("--triton-queue-delay-us", type=int, default=0, metavar="US",
                      help="with --triton-repo: how long Triton's dynamic batcher may hold a request to merge it with "
                           "other daemons' (max_queue_delay_microseconds; default 0: merge only what is queued)")

    engine = sub.add_parser("build-engine", parents=[common],
                            help="build TensorRT engines into engines/ (needs TensorRT, cuda-python and a GPU)")
    engine.add_argument("--model", action="append", help="model name (default: the config's detector and emotion)")
    engine.add_argument("--precision", choices=["fp32", "fp16", "int8"], default=None,
                        help="which prepared ONNX to build from (default: inference.precision)")
    engine.add_argument("--max-batch", type=int, default=None, help="largest batch (default: inference.max_batch)")
    engine.add_argument("--input-size", type=_size, default=None, metavar="WxH",
                        help="detector input size (default: the config's detector.input_size; required when "
                             "that is auto, e.g. 640x352 for 16:9 cameras: an engine is built for one size)")
    engine.add_argument("--config", type=Path, default=DEFAULT_CONFIG, metavar="PATH",
                        help="YAML config for the models and inference settings (default: config/default.yaml)")
    engine.add_argument("--force", action="store_true", help="rebuild even if a matching engine exists")

    analyze = sub.add_parser("analyze", parents=[common], help="images, folders or videos -> one JSON line per image/frame",
                             description=ANALYZE_DESCRIPTION, epilog=ANALYZE_EXAMPLES,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_analyze_args(analyze)

    bench = sub.add_parser("bench", help="measure throughput and latency",
                           description="Measurements, each side by side with its baseline in one run: a table on\n"
                                       "stdout, --json FILE and --plot FILE.png too. See BENCHMARKS.md.",
                           epilog=BENCH_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    from pipeline.tools.bench import add_bench_args

    add_bench_args(bench, [common])
    return parser


def _size(text: str) -> tuple[int, int]:
    try:
        width, height = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected WIDTHxHEIGHT such as 320x192, got {text!r}") from None
    return width, height


def _detector_input(text: str) -> tuple[int, int] | Literal["auto"]:
    """`auto` or WxH, as detector.input_size takes."""
    return "auto" if text.strip().lower() == "auto" else _size(text)


def _add_analyze_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", type=Path, metavar="PATH",
                        help="image, video or folder (walked recursively; <emotion>/<file> or a labels.csv of "
                             "file,emotion gives an accuracy)")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, metavar="PATH",
                        help="YAML config for the models, detector and emotion settings (default: "
                             "config/default.yaml)")
    parser.add_argument("--every", type=int, default=1, metavar="N",
                        help="videos: analyse every Nth frame (default 1: every frame)")
    parser.add_argument("--cropped", action="store_true", help="each image is one face crop: skip detection")
    parser.add_argument("--holdout", action="store_true",
                        help="with an .npz of training crops: only the validation hold-out that "
                             "tools/train_emotion.py never trains on (split seed 20261201: 10 %% per class of "
                             "FER2013's split; 10 %% of the people of a photo bundle)")
    parser.add_argument("--crop", choices=["align", "box"], default=None, help="override emotion.crop")
    parser.add_argument("--detector-input", type=_detector_input, default=None, metavar="WxH|auto",
                        help="override detector.input_size (default: the config's, auto in config/default.yaml: "
                             "the frame's aspect ratio, long side detector.max_input_side, e.g. 640x352 for 1080p; "
                             "`bench analyze` uses 320x192), e.g. 320x192; the sizes used are logged once, and per "
                             "file with --log-level debug")
    form = parser.add_mutually_exclusive_group()
    form.add_argument("--json", dest="summary_form", action="store_const", const="json", default="auto",
                      help="the summary as one `summary: {JSON}` line on stderr even on a terminal (the default "
                           "when stderr is not a terminal)")
    form.add_argument("--table", dest="summary_form", action="store_const", const="table",
                      help="the summary as a table (accuracy, balanced accuracy, per-class recall and precision, "
                           "the confusion grid) even when stderr is not a terminal (the default on a terminal)")


def _add_run_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, metavar="PATH",
                        help="YAML config: cameras, models, outputs, server (default: config/default.yaml)")
    parser.add_argument("--duration", type=float, default=None, help="stop cleanly after this many seconds")


def cmd_schema(args: argparse.Namespace) -> int:
    """The JSON Schema on stdout (or --output), and the Markdown key reference with --markdown."""
    from pipeline.config.schema import markdown_reference, schema_text

    if args.output is None:
        sys.stdout.write(schema_text())
    else:
        args.output.write_text(schema_text(), encoding="utf-8")
        log.info("wrote %s", args.output)
    if args.markdown is not None:
        args.markdown.write_text(markdown_reference(), encoding="utf-8")
        log.info("wrote %s", args.markdown)
    return 0


def cmd_send_test(args: argparse.Namespace) -> int:
    """Open the config's outputs, send the test command and neutral after --hold-s; exit 2 for an unknown name."""
    from pipeline.service.trial import UnknownStream, send_trial_from_config

    try:
        reached = send_trial_from_config(args.config, args.avatar, args.expression, args.weight, args.hold_s)
    except UnknownStream as exc:
        print(f"send-test: {exc}", file=sys.stderr)
        return 2
    for line in reached:
        print(f"sent {args.expression} to {line}")
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": cmd_run,
    "check-config": cmd_check_config,
    "schema": cmd_schema,
    "send-test": cmd_send_test,
    "prepare-models": cmd_prepare_models,
    "build-engine": cmd_build_engine,
    "analyze": cmd_analyze,
    "bench": cmd_bench,
}


def _release_startup_signals() -> None:
    """A one-shot command has no handlers of its own: SIGTERM, SIGHUP and SIGINT get back what they did before
    run_pipeline.py's StartupSignals, and one that arrived meanwhile is re-raised. `run` leaves them to the daemon."""
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        release = getattr(signal.getsignal(signum), "release", None)
        if callable(release):
            release()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")):
        argv = ["run", *argv]  # `run` is the default subcommand
    args = parser.parse_args(argv)
    args.argv = argv  # as given: a bench writes it into its results file
    if args.command != "run":
        _release_startup_signals()
    setup_logging(args.log_level or "info", "text")
    try:
        return COMMANDS[args.command](args)
    except ConfigError as exc:
        for issue in exc.issues:
            print(issue.format(), file=sys.stderr)
        return EXIT_CONFIG
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except MODEL_ERRORS as exc:
        print(f"model error: {exc}", file=sys.stderr)
        return EXIT_MODEL
    except KeyboardInterrupt:
        return EXIT_OK
