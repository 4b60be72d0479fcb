"""What a camera group's observations cost on their way to the daemon: the CPU per observation of a group process
whose camera threads each put one message on a multiprocessing queue per observation (what pipeline/service/groups.py
does), against the same observations sent in batches, and of the process reading them.

A camera group sends every observation to the daemon (`("observation", obs)` on a multiprocessing.Queue): each put
wakes the queue's feeder thread, which pickles the message and writes it to a pipe, and the daemon's reader unpickles
it. At 150 cameras × 25 fps that is 3,750 messages a second. This probe runs THREADS threads in a child process, each
putting observations shaped like group_1080p.mp4's (FACES faces with landmarks, probabilities, a smoothed copy and a
head pose) at FPS, one message per observation (BATCH_MS 0), all threads' observations of BATCH_MS in one message
(> 0), or none (-1: what making them costs), with the parent reading them; it prints each side's CPU per observation
(process CPU time over the window, the kernel's count), each setting twice, the second round reversed.

    python deploy/observation_queue_probe.py [THREADS=30] [FPS=25] [SECONDS=8] [FACES=6] [BATCH_MS=-1,0,10]
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.core.types import Detection, EmotionScores, FaceResult, HeadPose, Observation  # noqa: E402


def observation(camera: str, index: int, faces: int, rng: np.random.Generator) -> Observation:
    results = []
    for track in range(faces):
        probs = rng.dirichlet(np.ones(7)).astype(np.float32)
        detection = Detection((100.0 + track, 200.0, 160.0 + track, 270.0), 0.97,
                              rng.uniform(0, 1000, (5, 2)).astype(np.float32))
        results.append(FaceResult(detection, EmotionScores(probs), track, EmotionScores(probs.copy()),
                                  HeadPose(3.0, -2.0, 1.0, True)))
    now = time.monotonic()
    return Observation(camera, index, now, time.time(), (1920, 1080), tuple(results),
                       {"detect": 4.0, "crop": 0.5, "emotion": 2.0})


class Sender:
    """How a thread's observations leave: one put each (`batch_s` 0), through one sender thread that puts whatever
    all threads made in the last `batch_s` as one message (> 0), or not at all (< 0: the cost of making them)."""

    def __init__(self, out: mp.Queue, batch_s: float) -> None:
        self.out, self.batch_s = out, batch_s
        self.pending: list[Observation] = []
        self.lock = threading.Lock()
        self.made = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._flush_loop, daemon=True) if batch_s > 0 else None
        if self.thread is not None:
            self.thread.start()

    def send(self, obs: Observation) -> None:
        self.made += 1
        if self.batch_s == 0:
            self.out.put(("observation", obs))
        elif self.batch_s > 0:
            with self.lock:
                self.pending.append(obs)

    def _flush_loop(self) -> None:
        while not self.stop.wait(self.batch_s):
            self._flush()
        self._flush()

    def _flush(self) -> None:
        with self.lock:
            batch, self.pending = self.pending, []
        if batch:
            self.out.put(("observations", tuple(batch)))

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join()


def camera_thread(sender: Sender, camera: str, fps: float, faces: int, until: float) -> None:
    rng = np.random.default_rng(abs(hash(camera)) % 2**32)
    index = 0
    next_at = time.monotonic()
    while next_at < until:
        time.sleep(max(0.0, next_at - time.monotonic()))
        sender.send(observation(camera, index, faces, rng))
        index += 1
        next_at += 1.0 / fps


def group(out: mp.Queue, cpu_out: mp.Queue, threads: int, fps: float, seconds: float, faces: int,
          batch_s: float) -> None:
    until = time.monotonic() + seconds
    started = time.process_time()
    sender = Sender(out, batch_s)
    workers = [threading.Thread(target=camera_thread, args=(sender, f"cam{n}", fps, faces, until))
               for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    sender.close()
    cpu_out.put((time.process_time() - started, sender.made))
    out.put(("done",))


def run(threads: int, fps: float, seconds: float, faces: int, batch_ms: float) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    out, cpu_out = ctx.Queue(4096), ctx.Queue()
    child = ctx.Process(target=group, args=(out, cpu_out, threads, fps, seconds, faces, batch_ms / 1e3))
    child.start()
    received, started = 0, None
    while True:
        try:
            message = out.get(timeout=30)
        except queue.Empty:
            break
        if started is None:
            started = time.process_time()
        if message[0] == "done":
            break
        received += 1 if message[0] == "observation" else len(message[1])
    reader_cpu = time.process_time() - (started or time.process_time())
    group_cpu, made = cpu_out.get(timeout=30)
    child.join(30)
    return {"batch_ms": batch_ms, "made": made, "received": received,
            "group_us_per_obs": round(group_cpu / max(1, made) * 1e6, 1),
            "reader_us_per_obs": round(reader_cpu / max(1, made) * 1e6, 1)}


def main() -> None:
    args = sys.argv[1:]
    threads = int(args[0]) if len(args) > 0 else 30
    fps = float(args[1]) if len(args) > 1 else 25.0
    seconds = float(args[2]) if len(args) > 2 else 8.0
    faces = int(args[3]) if len(args) > 3 else 6
    batches = [float(v) for v in (args[4] if len(args) > 4 else "-1,0,10").split(",")]
    for round_ in (1, 2):
        for batch_ms in batches if round_ == 1 else batches[::-1]:
            print({"round": round_, **run(threads, fps, seconds, faces, batch_ms)}, flush=True)


if __name__ == "__main__":
    main()
