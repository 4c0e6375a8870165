"""Names of the Cell lane's asset checks (module constants, so tests and sensors share them)."""

DROP_MANIFEST_CHECK = "drop_manifest_and_checksums"
PLATE_SCHEMA_CHECK = "plate_schema"
PLATE_LAYOUT_CHECK = "plate_layout_and_controls"
Z_PRIME_CHECK = "z_prime_at_least_0_5"

# Rules from cell_lane.plate_validation that concern where wells are, not what they hold.
LAYOUT_RULES = frozenset({"invalid_well", "well_outside_plate", "duplicate_well", "missing_controls", "mixed_plate_format"})
