"""The GPU wing: one CUDA binding (cuda-python) for every GPU path: error checks, pinned and device buffers, streams and events; the ONNX Runtime CUDA lanes; the native TensorRT backend and its engine builder (build-engine).

Owns: gpu.cuda, gpu.cuda_lane, gpu.frame_lane (the frame graphs on one CUDA stream, frames read in GPU memory), gpu.tensorrt, gpu.engine_key (what an engine is built for, pure), gpu.engine_build. May import: inference.backend, modelprep, core. cuda-python and tensorrt are imported only inside functions, so this wing imports on machines without a GPU."""
