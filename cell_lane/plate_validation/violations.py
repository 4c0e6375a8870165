"""What a check reports: ``Violation``, ``PlateFileResult`` and the per-rule cap."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

MAX_VIOLATIONS_PER_RULE = 20
"""At most this many violations of one rule are listed per file; the rest are
summarised in one final "… and N more" violation."""

#: Order in which rules are listed: file-level problems, then cell-level
#: problems, then plate-level problems (which are often consequences of the former).
RULE_ORDER: tuple[str, ...] = (
    "unsupported_file_type",
    "empty_file",
    "encoding",
    "delimiter",
    "malformed_csv",
    "unreadable_parquet",
    "duplicate_column",
    "missing_column",
    "extra_column",
    "missing_value",
    "non_numeric_readout",
    "non_numeric_value",
    "out_of_range",
    "invalid_well",
    "well_outside_plate",
    "unknown_sample_type",
    "duplicate_well",
    "mixed_plate_format",
    "missing_controls",
    "schema",
)


@dataclass(frozen=True)
class Violation:
    """One problem found in a plate file, with where it is and how to fix it.

    ``row`` is the 1-based data row (the first row under the header is row 1);
    it is ``None`` for problems that concern the whole file or a whole plate.
    """

    file: str
    rule: str
    message: str
    row: int | None = None
    well: str | None = None
    column: str | None = None
    plate_barcode: str | None = None

    def describe(self) -> str:
        """One line, e.g. ``plates/p1.csv row 12 (well B03, column readout): rule — message``."""
        head = self.file
        if self.row is not None:
            head += f" row {self.row}"
        parts: list[str] = []
        if self.row is None and self.plate_barcode is not None:
            parts.append(f"plate {self.plate_barcode}")
        if self.well is not None:
            parts.append(f"well {self.well}")
        if self.column is not None:
            parts.append(f"column {self.column}")
        if parts:
            head += f" ({', '.join(parts)})"
        message = " ".join(self.message.split())
        return f"{head}: {self.rule} — {message}"

    def to_dict(self) -> dict[str, Any]:
        """All fields as a plain dict (JSON-serialisable)."""
        return asdict(self)


class PlateFileResult:
    """Everything learnt from one plate file.

    ``table`` is the typed pandas table (the plate columns present in the file,
    plus ``source_file`` and the 1-based ``row``) or ``None`` if the file could
    not be read at all. Only rely on its values when ``ok`` is true. It is built
    from the checked columns the first time it is asked for: a caller that only
    wants the verdict does not pay for a pandas table.
    """

    def __init__(
        self,
        file: str,
        table: pd.DataFrame | None = None,
        violations: list[Violation] | None = None,
        z_primes: dict[str, float] | None = None,
        plate_formats: dict[str, int] | None = None,
        *,
        build_table: Callable[[], pd.DataFrame] | None = None,
    ) -> None:
        self.file = file
        self.violations = violations if violations is not None else []
        self.z_primes = z_primes if z_primes is not None else {}
        self.plate_formats = plate_formats if plate_formats is not None else {}
        self._table = table
        self._build_table = build_table

    @property
    def table(self) -> pd.DataFrame | None:
        if self._table is None and self._build_table is not None:
            self._table, self._build_table = self._build_table(), None
        return self._table

    @property
    def ok(self) -> bool:
        """True when the file has no violations at all."""
        return not self.violations

    def __repr__(self) -> str:
        return f"PlateFileResult(file={self.file!r}, ok={self.ok}, violations={len(self.violations)}, plates={self.plate_formats})"


@dataclass
class Findings:
    """Violations found so far; a check that finds many rows formats only the first few.

    ``unlisted`` counts, per rule, the violations found but not formatted: ``cap``
    adds them to the "… and N more" line, so the totals stay true.
    """

    listed: list[Violation] = field(default_factory=list)
    unlisted: Counter[str] = field(default_factory=Counter)

    def add(self, violation: Violation) -> None:
        self.listed.append(violation)

    def at_rows(
        self, rule: str, mask: np.ndarray, make: Callable[[int], Violation]
    ) -> None:
        """One violation of ``rule`` per true entry of ``mask`` (row = position + 1), the first ones formatted."""
        if not mask.any():
            return
        positions = np.flatnonzero(mask)
        for position in positions[:MAX_VIOLATIONS_PER_RULE]:
            self.listed.append(make(int(position) + 1))
        self.unlisted[rule] += max(0, positions.size - MAX_VIOLATIONS_PER_RULE)

    def capped(self) -> list[Violation]:
        return cap(self.listed, unlisted=self.unlisted)


def cap(
    violations: list[Violation],
    limit: int = MAX_VIOLATIONS_PER_RULE,
    unlisted: Counter[str] | None = None,
) -> list[Violation]:
    """Group by rule (in ``RULE_ORDER``), sort by row, keep ``limit`` per rule.

    ``unlisted`` counts violations of a rule that were found but never formatted
    (they come after the listed ones); they count towards the "… and N more" line.
    """
    unlisted = unlisted or Counter()
    groups: dict[str, list[Violation]] = {
        rule: [] for rule, count in unlisted.items() if count
    }
    for violation in violations:
        groups.setdefault(violation.rule, []).append(violation)
    rank = {rule: position for position, rule in enumerate(RULE_ORDER)}
    ordered = sorted(groups.items(), key=lambda item: rank.get(item[0], len(rank)))
    capped: list[Violation] = []
    for rule, group in ordered:
        group = sorted(group, key=lambda v: (v.row is None, v.row or 0))
        capped.extend(group[:limit])
        total = len(group) + unlisted[rule]
        hidden = total - limit
        if hidden > 0:
            capped.append(
                Violation(
                    file=group[0].file,
                    rule=rule,
                    message=(
                        f"… and {hidden} more {rule} violations in this file "
                        f"({total} in total) are not listed. Fix the ones above (the "
                        "same cause is likely behind the rest), then check the file again."
                    ),
                )
            )
    return capped
