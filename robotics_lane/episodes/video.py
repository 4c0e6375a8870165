"""Camera frames as MP4 video, the way LeRobot v3 stores them: encode, probe and decode with PyAV.

Codec: AV1, encoded by SVT-AV1 (PyAV's `libsvtav1`), pixel format yuv420p, with LeRobot 0.6.1's
own defaults (`VideoEncoderConfig`): a key frame every 2 frames (`g` 2, so a reader reaches any
frame by decoding at most one other), `crf` 30, preset 12 (SVT-AV1 4.x runs it as 11), no
fast-decode tuning. AV1 is what LeRobot records by default; PyAV's wheel encodes it here and
decodes it with dav1d, and LeRobot's reader (PyAV or torchcodec) decodes it. AV1 is lossy:
decoded frames differ from the originals by about two grey levels on average (more on sharp,
busy images).

Encoding is deterministic: one encoder thread (SVT-AV1's `lp=1`), fixed parameters, and no
creation time in the container, so the same frames give the same bytes with the same PyAV
build on the same kind of CPU. A rollout shard relaunched after preemption writes the very
files the first attempt did. SVT-AV1's settings banner, printed each time an encoder opens, is
kept out of stderr, and the real-time scheduling SVT-AV1 gives a process run as root is undone
(`workload_runtime.codecs`; set `SVT_LOG` yourself to see the banner).

Decoding uses PyAV's stream threading (`thread_type="AUTO"`); `probe_video` decodes every frame
to prove the file decodes but never converts a frame to RGB, since it only counts and times them.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction

import av
import fsspec
import numpy as np
from fsspec.implementations.local import LocalFileSystem

from workload_runtime.codecs import keep_scheduling, quiet_video_encoders

CODEC, CODEC_NAME, PIX_FMT = "libsvtav1", "av1", "yuv420p"  # encoder; the stream's codec as readers name it
GOP, CRF, PRESET, FAST_DECODE = 2, 30, 12, 0
ENCODER_OPTIONS = {"g": str(GOP), "crf": str(CRF), "preset": str(PRESET), "svtav1-params": f"fast-decode={FAST_DECODE}:lp=1"}
IMAGE_NAMES = ["height", "width", "channels"]
_QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}


class VideoUnreadable(Exception):
    """A video file that PyAV cannot open or decode; the message says what FFmpeg reported."""


def encode_video(frames: np.ndarray, fps: int) -> bytes:
    """MP4 bytes of `frames` (uint8 (T, H, W, 3) RGB) at `fps`, one video frame per row, pts k / fps."""
    _, height, width, _ = frames.shape
    quiet_video_encoders()
    sink = io.BytesIO()
    # SVT-AV1 run as root makes this process real-time when the encoder opens (at the first frame).
    with keep_scheduling() as restore, av.open(sink, "w", format="mp4") as container:
        stream = container.add_stream(CODEC, rate=int(fps), options=dict(ENCODER_OPTIONS))
        stream.pix_fmt, stream.width, stream.height = PIX_FMT, width, height
        for index, image in enumerate(frames):
            container.mux(stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")))
            if index == 0:
                restore()
        container.mux(stream.encode())
    return sink.getvalue()


def video_feature(height: int, width: int, fps: int) -> dict:
    """A camera's entry in info.json's `features`, as LeRobot 0.6.1 writes it for its own recordings."""
    info = {
        "video.height": height, "video.width": width, "video.codec": CODEC_NAME, "video.pix_fmt": PIX_FMT,
        "video.fps": int(fps), "video.channels": 3, "has_audio": False,
        "video.g": GOP, "video.crf": CRF, "video.preset": PRESET, "video.fast_decode": FAST_DECODE,
        "video.video_backend": "pyav", "video.extra_options": {}, "is_depth_map": False,
    }  # fmt: skip
    return {"dtype": "video", "shape": [height, width, 3], "names": list(IMAGE_NAMES), "info": info}


# --- image statistics (meta/stats.json) -------------------------------------------------------


def pixel_histogram(frames: np.ndarray) -> np.ndarray:
    """How many pixels of each channel take each value 0..255: (3, 256) int64. Histograms add up
    across episodes, so a dataset's image stats are exact whether written at once or assembled."""
    flat = frames.reshape(-1, 3)
    return np.stack([np.bincount(flat[:, c], minlength=256) for c in range(3)]).astype(np.int64)


def image_stats(histogram: np.ndarray, frames: int) -> dict[str, list]:
    """Per-channel stats of pixel values scaled to [0, 1], in LeRobot's (3, 1, 1) layout; `count`
    is the number of frames. Quantiles are exact (numpy's linear interpolation) from the histogram."""
    values = np.arange(256, dtype=np.float64) / 255.0
    total = histogram.sum(axis=1, keepdims=True).astype(np.float64)
    mean = (histogram * values).sum(axis=1) / total[:, 0]
    std = np.sqrt(np.maximum((histogram * values**2).sum(axis=1) / total[:, 0] - mean**2, 0.0))
    present = histogram > 0
    entry = {
        "min": np.array([values[row].min() for row in present]),
        "max": np.array([values[row].max() for row in present]),
        "mean": mean,
        "std": std,
    }
    cumulative = histogram.cumsum(axis=1)
    for name, q in _QUANTILES.items():
        entry[name] = np.array([_quantile(cum, q) for cum in cumulative]) / 255.0
    out = {name: v.reshape(3, 1, 1).tolist() for name, v in entry.items()}
    return {**{k: out[k] for k in ("min", "max", "mean", "std")}, "count": [int(frames)], **{k: out[k] for k in _QUANTILES}}


def _quantile(cumulative: np.ndarray, q: float) -> float:
    """np.quantile(values, q) of the values a cumulative histogram counts (linear interpolation)."""
    position = q * (cumulative[-1] - 1)
    below = int(np.floor(position))
    low = np.searchsorted(cumulative, below, side="right")
    high = np.searchsorted(cumulative, min(below + 1, cumulative[-1] - 1), side="right")
    return float(low + (high - low) * (position - below))


# --- reading ------------------------------------------------------------------------------------


@contextlib.contextmanager
def open_video(fs: fsspec.AbstractFileSystem, path: str) -> Iterator[tuple[av.container.InputContainer, av.VideoStream]]:
    """The container and its first video stream, threaded decoding on; VideoUnreadable when FFmpeg
    cannot open it or it holds no video stream. FileNotFoundError when there is no file."""
    with contextlib.ExitStack() as stack:
        source = path if isinstance(fs, LocalFileSystem) else stack.enter_context(fs.open(path, "rb"))
        try:
            container = stack.enter_context(av.open(source, "r"))
        except av.FFmpegError as exc:
            if isinstance(exc, FileNotFoundError):
                raise
            raise VideoUnreadable(f"FFmpeg cannot open it ({exc})") from exc
        if not container.streams.video:
            raise VideoUnreadable("it holds no video stream")
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        yield container, stream


@dataclass(frozen=True)
class VideoProbe:
    """What a video file holds, from decoding every frame of its first video stream."""

    width: int
    height: int
    header_fps: Fraction | None  # FFmpeg's guess of the stream's frame rate (r_frame_rate, what LeRobot records)
    times: np.ndarray  # presentation time of each decoded frame in seconds, ascending

    @property
    def fps(self) -> float | None:
        """Frames per second the frames are actually presented at: 1 / the median interval between
        them (a dropped or late frame does not move it; FFmpeg's header guess can), else the header's."""
        interval = float(np.median(np.diff(self.times))) if len(self.times) > 1 else 0.0
        if interval > 0:
            return 1.0 / interval
        return float(self.header_fps) if self.header_fps else None


def probe_video(fs: fsspec.AbstractFileSystem, path: str) -> VideoProbe:
    """Decode every frame (no RGB conversion) and time it; VideoUnreadable on a decode error."""
    with open_video(fs, path) as (container, stream):
        pts = []
        try:
            for frame in container.decode(stream):
                if frame.pts is None:
                    raise VideoUnreadable(f"frame {len(pts)} has no presentation time")
                pts.append(frame.pts)
        except av.FFmpegError as exc:
            raise VideoUnreadable(f"decoding stops after {len(pts)} frames ({exc})") from exc
        rate = stream.base_rate or stream.average_rate
        times = np.sort(np.asarray(pts, dtype=np.float64)) * float(stream.time_base)
        return VideoProbe(stream.width, stream.height, Fraction(rate) if rate else None, times)


def in_span(times: np.ndarray, start_s: float, end_s: float, fps: int) -> np.ndarray:
    """Which frames belong to an episode's [from_timestamp, to_timestamp) span, each edge moved half
    a frame earlier so frames a rounding error off their slot land in the right episode."""
    half = 0.5 / fps
    return (times >= start_s - half) & (times < end_s - half)


def decode_video(fs: fsspec.AbstractFileSystem, path: str, start_s: float, end_s: float, fps: int) -> np.ndarray:
    """The frames of [start_s, end_s) as uint8 (T, H, W, 3) RGB, seeking to the key frame before
    `start_s` first (LeRobot's own files hold many episodes each)."""
    half = 0.5 / fps
    with open_video(fs, path) as (container, stream):
        shape, time_base = (0, stream.height, stream.width, 3), float(stream.time_base)
        if start_s > 0:
            container.seek(max(int((start_s - 2 * half) / stream.time_base), 0), stream=stream, backward=True, any_frame=False)
        frames = []
        try:
            for frame in container.decode(stream):
                t = frame.pts * time_base
                if t >= end_s - half:
                    break
                if t >= start_s - half:
                    frames.append(frame.to_ndarray(format="rgb24"))
        except av.FFmpegError as exc:
            raise VideoUnreadable(f"decoding stops after {len(frames)} frames ({exc})") from exc
    return np.stack(frames) if frames else np.zeros(shape, np.uint8)
