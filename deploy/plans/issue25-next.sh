# Issue 25's next lease (deploy/gpu-plan.sh runs it; END=540 in one call): the NV12 tree's frames and p99 with the
# defaults on a host that keeps up (round 24's H100 host was of the slowed kind: 64 cameras kept 87-91 %), so that
# BENCHMARKS.md's 64- and 150-camera figures for today's tree come from a healthy host; then 8 cameras' memory, and
# one process of 64 counted right (round 24's correction gives only an upper bound). The first step says which kind
# of host it is (a healthy one keeps 99.9 % of 64 cameras' frames).
step 110 groups CAMS=64 PROCS=2 INTERVAL=3 DURATION=20 TAG=_nv12_a EXTRA="--set emotion.model=dlibface_student64"
step 130 groups CAMS=150 PROCS=5 INTERVAL=3 DURATION=20 TAG=_nv12 EXTRA="--set emotion.model=dlibface_student64"
step 110 groups CAMS=64 PROCS=2 INTERVAL=3 DURATION=20 TAG=_nv12_b EXTRA="--set emotion.model=dlibface_student64"
step 130 groups CAMS=150 PROCS=5 INTERVAL=3 DURATION=20 TAG=_nv12_b EXTRA="--set emotion.model=dlibface_student64"
step 80 memory VARIANTS=cams8 DURATION=10
step 80 groups CAMS=64 PROCS=1 INTERVAL=3 DURATION=20 TAG=_one_counted EXTRA="--set emotion.model=dlibface_student64"
