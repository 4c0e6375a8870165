"""What the video codecs read from the process environment, set once where frames are encoded.

SVT-AV1 (the AV1 encoder in PyAV's wheel, which LeRobot records with) prints about twenty lines of
settings to stderr each time an encoder opens, unless `SVT_LOG` says otherwise; in a demo or a
workload's log that drowns what matters. `quiet_video_encoders()` keeps it to errors, unless the
user has set `SVT_LOG` themselves.
"""

import os

SVT_ERRORS_ONLY = "1"


def quiet_video_encoders() -> None:
    """Keep SVT-AV1's per-encoder banner out of stderr (errors still show); a user's SVT_LOG wins."""
    # Written, not read: the encoder's C library reads SVT_LOG from the process environment.
    os.environ.setdefault("SVT_LOG", SVT_ERRORS_ONLY)
