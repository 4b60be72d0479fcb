"""Model preparation: manifests, obtaining and converting weights (our Keras HDF5 converter), graph edits (uint8 input, preprocessing and top-K candidates in the graph), fp16/int8 variants, verification; what prepare-models runs.

Owns: modelprep.manifest, modelprep.prepare, modelprep.graph_edit, modelprep.keras_convert, modelprep.quantize, modelprep.triton_repo (the prepared models as a Triton model repository), modelprep.frame_graphs (letterbox, candidate decoding + NMS and face crops as ONNX graphs around the prepared models). May import: vision (letterbox for calibration), core."""
