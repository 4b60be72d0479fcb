#!/usr/bin/env bash
# eval.sh MODEL...: wild (detector), FER hold-out and mux hold-out through analyze; one summary line per set
cd "$(dirname "$0")/../../.." && . .venv/bin/activate && mkdir -p /tmp/ev
for m in "$@"; do
  sed "/^emotion:/,/^[a-z]/ s/^  model: .*/  model: $m/" config/default.yaml > /tmp/ev/$m.yaml  # emotion.model = m
  python run_pipeline.py analyze --config /tmp/ev/$m.yaml ../shared/data/faces/wild > /tmp/ev/$m.wild.jsonl 2> /tmp/ev/$m.wild.err
  python run_pipeline.py analyze --config /tmp/ev/$m.yaml --cropped --holdout ../shared/data/train/fer2013_train_jpeg.npz > /tmp/ev/$m.fer.jsonl 2> /tmp/ev/$m.fer.err
  python run_pipeline.py analyze --config /tmp/ev/$m.yaml --cropped --holdout ../shared/data/train/mux_dwdii_112.npz > /tmp/ev/$m.mux.jsonl 2> /tmp/ev/$m.mux.err
  python3 - "$m" <<'PY'
import json, sys
m = sys.argv[1]
out = [m]
for s in ("wild", "fer", "mux"):
    text = open(f"/tmp/ev/{m}.{s}.err").read().strip().splitlines()[-1]
    d = json.loads(text[text.find("{"):])
    r = d.get("recall", {})
    out.append(f"{s} {100*d['accuracy']:.1f}% n={d['labelled']} bal {100*sum(r.values())/len(r):.1f} N {r.get('neutral',0):.2f} H {r.get('happy',0):.2f}")
print(" | ".join(out), flush=True)
PY
done
