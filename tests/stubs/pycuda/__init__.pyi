# Minimal local stubs: pycuda ships no type information. Only what pipeline/cuda_util.py uses is declared.
