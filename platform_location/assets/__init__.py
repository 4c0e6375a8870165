"""Cross-lane platform assets."""
