"""LeRobot's own reader, run from the suite (tests/test_lerobot_reader.py).

`check_dataset.py` and `add_camera.py` run as scripts inside the LeRobot runtime
(`.venv-lerobot`, mk/lerobot.mk); `compare.py` runs in the project's venv and holds what they
dumped against what our own reader returns.
"""
