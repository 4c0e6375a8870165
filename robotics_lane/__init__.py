"""The Robotics lane: teleop episodes, Isaac Lab rollouts on spot capacity, policy training.

Not built yet (issue 3). Rule: it never imports the Cell lane.
"""
