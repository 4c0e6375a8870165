"""Intake: the landing-zone protocol every kind of drop follows, and quarantine for bad drops."""
