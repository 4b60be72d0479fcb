"""Probe of NVDEC's display latency and memory per decoder (deploy/gpu-bench.sh nvdec-latency; issue 11).

Why: PyNvVideoCodec's decoder holds frames back before it outputs them (its docstring: "NATIVE - a latency of 4
frames, output in display order"; "LOW - 0 frames, display order"; "ZERO - 0 frames, decode order"). For a live
camera every held frame is 40 ms at 25 fps that no `bench pipeline` figure shows (their clock starts when a frame
comes out of the decoder), inside the project's 100 ms camera-to-command budget. This measures, per clip and per
latency mode, with the same calls as `capture.nvdec.NvdecSource`:
- the delay in frames: packets fed minus frames out, when each frame comes out (mean and max);
- whether the frames are the same as NATIVE's, in the same order (sha256 of each RGB frame);
- GPU memory taken per decoder: 16 decoders each decoding 60 frames, cudaMemGetInfo before and after;
- the same for the project's `NvdecSource` (which peeks at the first packets' timestamps and picks LOW when the stream
  has no B-frames, NATIVE when it has): its delay, its choice, and whether its frames are NATIVE's.

Prints one JSON line per measurement. Run from the project root on a GPU machine with PyNvVideoCodec and
cuda-python:  python3 deploy/nvdec_latency_probe.py .benchdata/video/group_1080p.mp4 .benchdata/video/woman2.mp4
"""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any

import numpy as np
import PyNvVideoCodec as nvc
from cuda.bindings import runtime

from pipeline.capture.nvdec import NvdecSource
from pipeline.inference.gpu.cuda import check, memory_info

FRAMES = 120
DECODERS = 16


def modes() -> dict[str, Any]:
    kind = nvc.DisplayDecodeLatencyType
    return {name: getattr(kind, name) for name in ("NATIVE", "LOW", "ZERO") if hasattr(kind, name)}


def decoder_for(demuxer: Any, latency: Any, colour: str = "RGB") -> Any:
    return nvc.CreateDecoder(gpuid=0, codec=demuxer.GetNvCodecId(), usedevicememory=True,
                             outputColorType=getattr(nvc.OutputColorType, colour), latency=latency)


def frame_digest(frame: Any) -> str:
    size = int(frame.framesize())
    host = np.empty(size, np.uint8)
    check(runtime.cudaMemcpy(host.ctypes.data, int(frame.GetPtrToPlane(0)), size,
                            runtime.cudaMemcpyKind.cudaMemcpyDeviceToHost), "cudaMemcpy")
    return hashlib.sha256(host.tobytes()).hexdigest()[:16]


def delays(path: str, latency: Any) -> tuple[list[int], list[str]]:
    """For the first FRAMES frames: packets fed minus frames out at each output, and each frame's digest."""
    demuxer = nvc.CreateDemuxer(filename=path)
    decoder = decoder_for(demuxer, latency)
    fed, out, lags, digests = 0, 0, [], []
    for packet in demuxer:
        fed += 1
        for frame in decoder.Decode(packet):
            out += 1
            lags.append(fed - out)
            digests.append(frame_digest(frame))
        if out >= FRAMES:
            break
    return lags, digests


def memory_per_decoder(path: str, latency: Any, colour: str = "RGB") -> float:
    """MB of GPU memory taken per decoder, DECODERS of them alive, each past its first 60 frames."""
    free_before, _ = memory_info()
    alive = []
    for _ in range(DECODERS):
        demuxer = nvc.CreateDemuxer(filename=path)
        decoder = decoder_for(demuxer, latency, colour)
        count = 0
        for packet in demuxer:
            count += len(decoder.Decode(packet))
            if count >= 60:
                break
        alive.append((demuxer, decoder))
    free_after, _ = memory_info()
    return round((free_before - free_after) / DECODERS / 1e6, 1)


def source_delays(path: str) -> tuple[list[int], list[str], str]:
    """delays() through NvdecSource: packets it pulled minus frames it gave, and each frame's digest (as RGB)."""
    source = NvdecSource(path, "probe")
    fed = 0

    def counted(packets: Any) -> Any:
        nonlocal fed
        for packet in packets:
            fed += 1
            yield packet

    source._packets = counted(source._packets)  # the peeked packets are counted when they are decoded
    lags, digests = [], []
    try:
        for out in range(1, FRAMES + 1):
            source.grab(1.0)
            lags.append(fed - out)
            rgb = np.ascontiguousarray(np.asarray(source.retrieve())[..., ::-1])  # host BGR: not kept on device
            digests.append(hashlib.sha256(rgb.tobytes()).hexdigest()[:16])
    except Exception as exc:  # noqa: BLE001 - a short clip ends: what was measured stands
        print(json.dumps({"clip": path, "source_stopped": f"{type(exc).__name__}: {exc}"}), flush=True)
    finally:
        chose = source.describe()
        source.close()
    return lags, digests, chose


def memory_by_output(paths: list[str]) -> None:
    """Issue 25: GPU memory per decoder by latency mode and output colour (RGB as the pipeline asks, or the
    decoder's own NV12), and what a decoded frame object offers (a presentation time to check the order by?)."""
    colours = [name for name in ("RGB", "NATIVE", "NV12") if hasattr(nvc.OutputColorType, name)]
    for path in paths:
        for name, latency in modes().items():
            for colour in colours:
                print(json.dumps({"clip": path, "latency": name, "output": colour,
                                  "mb_per_decoder": memory_per_decoder(path, latency, colour)}), flush=True)
    demuxer = nvc.CreateDemuxer(filename=paths[0])
    decoder = decoder_for(demuxer, modes()["LOW"])
    for packet in demuxer:
        frames = decoder.Decode(packet)
        if frames:
            frame = frames[0]
            members = [m for m in dir(frame) if not m.startswith("_")]
            values = {m: repr(getattr(frame, m))[:80] for m in members if not callable(getattr(frame, m, None))}
            print(json.dumps({"frame_members": members, "values": values,
                              "colours": [m for m in dir(nvc.OutputColorType) if not m.startswith("_")]}), flush=True)
            break


def main(paths: list[str]) -> int:
    check(runtime.cudaFree(0), "cudaFree(0) (context)")
    if paths and paths[0] == "--memory":
        memory_by_output(paths[1:])
        return 0
    available = modes()
    print(json.dumps({"modes": list(available), "members": [m for m in dir(nvc.DisplayDecodeLatencyType)
                                                            if not m.startswith("_")]}), flush=True)
    for path in paths:
        reference: list[str] = []
        for name, latency in available.items():
            lags, digests = delays(path, latency)
            reference = reference or digests
            print(json.dumps({"clip": path, "latency": name, "frames": len(lags),
                              "delay_mean": round(float(np.mean(lags)), 2), "delay_max": int(max(lags)),
                              "delay_first": lags[0], "same_frames_as_native": digests == reference,
                              "same_set_as_native": sorted(digests) == sorted(reference),
                              "mb_per_decoder": memory_per_decoder(path, latency)}), flush=True)
        lags, digests, chose = source_delays(path)
        print(json.dumps({"clip": path, "latency": "NvdecSource", "chose": chose, "frames": len(lags),
                          "delay_mean": round(float(np.mean(lags)), 2), "delay_max": int(max(lags)),
                          "same_frames_as_native": digests == reference[:len(digests)]}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
