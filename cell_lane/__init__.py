"""The Cell lane: assay plates from the lab → validated training sets → models → the next plate."""
