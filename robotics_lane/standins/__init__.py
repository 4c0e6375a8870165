"""Stand-ins for the systems outside the platform, for demos and tests only: the real-robot
evaluation cell and the teleoperator."""
