"""Sinewgrid's command line and the helpers behind it (above both lanes; imports them by module name)."""
