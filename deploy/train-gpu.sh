#!/usr/bin/env bash
# Trains the emotion model candidates of issue 13 on the lent H200 and leaves each run's model.onnx, checkpoint.pt
# and model_card.json under $TRAIN_OUT/<run>/ (default $OUT). PyTorch is preinstalled there; the training split
# travels in the git-ignored .traindata/ (here: cp ../shared/data/train/fer2013_train_jpeg.npz .traindata/; carry it).
#
# Two phases, each a set of runs in parallel on the one GPU (the networks are small: one alone leaves it mostly idle):
#   1. plain training: the small candidates (fast enough for 2 CPU cores) and larger teachers, the teacher twice
#      (the "_rep" copy is the same command again: it measures how exactly the recipe reproduces on this machine);
#   2. the small candidates distilled from the teacher (and the "_rep" student from the "_rep" teacher, so the whole
#      chain is reproduced end to end).
# Usage there:  EPOCHS=80 bash deploy/train-gpu.sh      (SMALL, TEACHER, EXTRA override the sets of runs)
# Recipe variants of one network instead (phase 1 only, in parallel, each NAME=OPTIONS separated by '|'):
#   VARIANTS="ema=--ema 0.999|mixup=--mixup 0.2|both=--ema 0.999 --mixup 0.2" ARCH=resnet_t:64 bash deploy/train-gpu.sh
# An ensemble distilled into one network: PHASE=1 trains ARCH once per seed of SEEDS (in parallel); PHASE=2 trains each
# student of STUDENTS (NAME=OPTIONS separated by '|') from all those seed runs at once (--teacher with several folders:
# their averaged probabilities). The phases are apart so that each fits in one 10-minute device call:
#   SEEDS="0 1 2" ARCH=resnet_t:64 PHASE=1 bash deploy/train-gpu.sh
#   SEEDS="0 1 2" STUDENTS="kd=|kd_erase=--erase 0.5" ARCH=resnet_t:64 PHASE=2 bash deploy/train-gpu.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
out=${TRAIN_OUT:-${OUT:-/tmp/out}}
data=.traindata/fer2013_train_jpeg.npz
epochs=${EPOCHS:-80}
small=${SMALL:-"resnet_t:64 resnet_t1:64"}
teacher=${TEACHER:-resnet_m:48}
extra=${EXTRA:-"resnet_s:48 vgg_s:48"}
mkdir -p "$out"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"

run() {  # run NAME ARCH SIZE [more train_emotion.py options]: one training, its log in $out/NAME.log
  local name=$1 arch=$2 size=$3; shift 3
  python3 tools/train_emotion.py --data "$data" --out "$out/$name" --arch "$arch" --size "$size" \
    --epochs "$epochs" --seed "${SEED:-0}" "$@" 2> "$out/$name.log"
  echo "$name: $(tail -1 "$out/$name.log")"
}

if [ -n "${SEEDS:-}" ]; then
  arch=${ARCH:-resnet_t:64}
  if [ "${PHASE:-1}" = 1 ]; then
    for seed in $SEEDS; do run "${arch/:/_}_s$seed" "${arch%:*}" "${arch#*:}" --seed "$seed" & done
  else
    teachers=(); for seed in $SEEDS; do teachers+=("$out/${arch/:/_}_s$seed"); done
    IFS='|' read -ra students <<< "${STUDENTS:-kd=}"
    for student in "${students[@]}"; do
      # shellcheck disable=SC2086  # the options are meant to split into words
      run "${arch/:/_}_${student%%=*}" "${arch%:*}" "${arch#*:}" --teacher "${teachers[@]}" ${student#*=} &
    done
  fi
  wait
  echo "phase ${PHASE:-1} done $(date +%T)"
  exit 0
fi

if [ -n "${VARIANTS:-}" ]; then
  arch=${ARCH:-resnet_t:64}
  IFS='|' read -ra variants <<< "$VARIANTS"
  for variant in "${variants[@]}"; do
    # shellcheck disable=SC2086  # the options are meant to split into words
    run "${arch/:/_}_${variant%%=*}" "${arch%:*}" "${arch#*:}" ${variant#*=} &
  done
  wait
  echo "variants done $(date +%T)"
  exit 0
fi

for spec in $small $extra; do run "${spec/:/_}" "${spec%:*}" "${spec#*:}" & done
run "${teacher/:/_}" "${teacher%:*}" "${teacher#*:}" &
run "${teacher/:/_}_rep" "${teacher%:*}" "${teacher#*:}" &
wait
echo "phase 1 done $(date +%T)"

for spec in $small; do
  run "${spec/:/_}_kd" "${spec%:*}" "${spec#*:}" --teacher "$out/${teacher/:/_}" &
done
first=${small%% *}
run "${first/:/_}_kd_rep" "${first%:*}" "${first#*:}" --teacher "$out/${teacher/:/_}_rep" &
wait
echo "phase 2 done $(date +%T)"
