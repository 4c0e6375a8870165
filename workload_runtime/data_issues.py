"""What is wrong with data someone handed in: one `DropIssue` per reason, with where it is.

The landing zones' checks (`control_plane/intake/`) and the workloads that check the episodes
they write (the robotics lane's episode validation runs on a GPU node too) report the same
shape, so it lives here, on the workload side, where both can use it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DropIssue:
    """One reason a drop cannot be accepted."""

    rule: str
    message: str
    file: str | None = None
    row: int | None = None
    well: str | None = None
    column: str | None = None

    def describe(self) -> str:
        return f"{self.located()} {self.message}"

    def located(self) -> str:
        """The rule and where it broke, without the message (which may quote the data)."""
        where = []
        if self.file:
            where.append(self.file)
        if self.row is not None:
            where.append(f"row {self.row}")
        if self.well:
            where.append(f"well {self.well}")
        if self.column:
            where.append(f"column {self.column}")
        prefix = f"{' '.join(where)}: " if where else ""
        return f"{prefix}[{self.rule}]"
