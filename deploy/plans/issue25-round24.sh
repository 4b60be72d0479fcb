# Issue 25, round 24 as run (2026-12-07, an H100; BENCHMARKS.md, "Round 24"): what a further CUDA session keeps
# in host memory with each provider option left that changes cuDNN's plans, the NV12 tree at 150 cameras, then
# fuse_conv_bias in the daemon's camera groups against the tree as it is. ~9 min: END=540 in one call.
step 150 session-probe TAG=_q \
  SESSION_VARIANTS="shared+cublas_ws_small shared+cublas_ws_small+nhwc shared+cublas_ws_small+fuse_bias shared+cublas_ws_small+nhwc+fuse_bias"
step 120 groups CAMS=150 PROCS=5 INTERVAL=3 DURATION=20 TAG=_nv12 EXTRA="--set emotion.model=dlibface_student64"
step 200 provider-ab CAMS=64 ROUNDS=1 DURATION=20 OPTS='"fuse_conv_bias": "1",'
