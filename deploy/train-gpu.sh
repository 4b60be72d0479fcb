#!/usr/bin/env bash
# Trains emotion model candidates on the lent H200 (issue 13), one after the other, and leaves each one's
# model.onnx + model_card.json under $OUT/<arch>_<size>/. PyTorch is preinstalled there; the training split travels
# in the git-ignored .traindata/ (cp ../shared/data/train/fer2013_train_jpeg.npz .traindata/ here, carry .traindata).
# Usage there:  ARCHS="resnet_t resnet_t1" SIZES="64" EPOCHS=60 bash deploy/train-gpu.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
data=.traindata/fer2013_train_jpeg.npz
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
for arch in ${ARCHS:-resnet_t resnet_t1}; do
  for size in ${SIZES:-64}; do
    python3 tools/train_emotion.py --data "$data" --out "$OUT/${arch}_${size}" --arch "$arch" --size "$size" \
      --epochs "${EPOCHS:-60}" --seed "${SEED:-0}" 2> "$OUT/${arch}_${size}.log"
    tail -1 "$OUT/${arch}_${size}.log"
  done
done
