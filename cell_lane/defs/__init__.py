"""Everything this code location defines, found by `dg.components.load_defs` (see ../definitions.py)."""
