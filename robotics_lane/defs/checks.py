"""Names of the Robotics lane's asset checks."""

SESSION_MANIFEST_CHECK = "session_manifest_and_checksums"
EPISODES_VALID_CHECK = "episodes_valid"
RESULTS_MANIFEST_CHECK = "results_manifest_and_checksums"
