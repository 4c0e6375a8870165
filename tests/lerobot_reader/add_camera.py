"""Give a state-only dataset a synthetic camera, encoded with PyAV — run inside `.venv-lerobot`.

    .venv-lerobot/bin/python tests/lerobot_reader/add_camera.py DATASET --frames-out FRAMES.npz

A test fixture for the image path of LeRobot's reader, until our own writer records cameras: it
draws one frame per row of the dataset (a bright box that moves with the frame index over a
colour gradient), encodes every episode into ONE H.264 MP4 (`videos/<key>/chunk-000/file-000.mp4`,
so later episodes start at a `from_timestamp` > 0, as LeRobot concatenates them), and adds the
feature to `meta/info.json` and the `videos/<key>/...` columns to the episodes table exactly as
LeRobot 0.6.1's writer does (its `DEFAULT_VIDEO_PATH` and `get_video_info`).

FRAMES.npz holds `source` (the frames drawn, uint8 (N, H, W, 3)) and `decoded` (the file decoded
start to end with plain PyAV, no seeking: an independent decode to hold LeRobot's against).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

KEY = "observation.images.front"


def draw(episode: int, frame: int, height: int, width: int) -> np.ndarray:
    """A gradient background and a box whose place depends on the episode and the frame."""
    y, x = np.mgrid[0:height, 0:width]
    image = np.stack([x * 255 // max(1, width - 1), y * 255 // max(1, height - 1), np.full_like(x, 40 * (episode % 5))], axis=-1)
    top, left = (3 * frame) % (height - 12), (5 * frame + 7 * episode) % (width - 12)
    image[top : top + 12, left : left + 12] = (250, 250, 250)
    return image.astype(np.uint8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", type=Path)
    parser.add_argument("--frames-out", type=Path, required=True)
    parser.add_argument("--height", type=int, default=48)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--gop", type=int, default=8, help="frames between keyframes (small, so LeRobot's seeks land mid-file)")
    args = parser.parse_args()
    from lerobot.datasets.utils import DEFAULT_VIDEO_PATH
    from lerobot.datasets.video_utils import get_video_info

    info_path = args.dataset / "meta" / "info.json"
    info = json.loads(info_path.read_text())
    fps = int(info["fps"])
    episodes_path = args.dataset / "meta" / "episodes" / "chunk-000" / "file-000.parquet"
    episodes = pq.read_table(episodes_path)
    lengths = episodes.column("length").to_pylist()

    rel = DEFAULT_VIDEO_PATH.format(video_key=KEY, chunk_index=0, file_index=0)
    video = args.dataset / rel
    video.parent.mkdir(parents=True, exist_ok=True)
    source = np.concatenate([np.stack([draw(e, f, args.height, args.width) for f in range(n)]) for e, n in enumerate(lengths)])
    av.logging.set_level(av.logging.ERROR)  # libx264's statistics would flood the test's output
    with av.open(str(video), "w") as container:
        stream = container.add_stream("libx264", rate=fps, options={"crf": "18", "g": str(args.gop), "threads": "1"})
        stream.width, stream.height, stream.pix_fmt = args.width, args.height, "yuv420p"
        for image in source:
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    with av.open(str(video)) as container:
        decoded = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
    if len(decoded) != len(source):
        raise SystemExit(f"{video}: encoded {len(source)} frames but {len(decoded)} decode back")

    ends = np.cumsum(lengths)
    starts, ends = (ends - lengths) / fps, ends / fps  # episode e's frames lie at [starts[e], ends[e]) in the one file
    zeros = pa.array(np.zeros(len(lengths), np.int64))
    for name, column in [("chunk_index", zeros), ("file_index", zeros), ("from_timestamp", pa.array(starts)), ("to_timestamp", pa.array(ends))]:
        episodes = episodes.append_column(f"videos/{KEY}/{name}", column)
    pq.write_table(episodes, episodes_path)
    info["video_path"] = DEFAULT_VIDEO_PATH
    shape = [args.height, args.width, 3]
    info["features"][KEY] = {"dtype": "video", "shape": shape, "names": ["height", "width", "channels"], "info": get_video_info(video)}
    info_path.write_text(json.dumps(info, indent=4))
    np.savez(args.frames_out, source=source, decoded=decoded)


if __name__ == "__main__":
    main()
