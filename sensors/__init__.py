"""Sensors and schedules. Each module builds its sensors from arguments, so it imports no lane."""
