"""Text columns as the checks see them: coded (few distinct values) or plain Arrow strings.

Barcodes, wells and sample types repeat a few values: they become integer codes into
their distinct stripped values (``Text``), so a rule compares integers and strips each
distinct value once. ``perturbation`` has nearly one value per row and stays Arrow
strings (``PlainText``), stripped only when the typed table is built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc


@dataclass
class Text:
    """One text column as integer codes into its distinct stripped values (-1: empty cell)."""

    codes: np.ndarray  # int32
    values: list[str]

    def at(self, row: int) -> str | None:
        code = int(self.codes[row - 1])
        return self.values[code] if code >= 0 else None

    def empty(self) -> np.ndarray:
        return self.codes < 0

    def equals(self, value: str) -> np.ndarray:
        return (
            self.codes == self.values.index(value)
            if value in self.values
            else np.zeros(len(self.codes), dtype=bool)
        )

    def objects(self) -> np.ndarray:
        """The column as Python strings (None when empty), for pandas; each distinct value is made once."""
        table = np.array([*self.values, None], dtype=object)
        return table[self.codes]  # code -1 takes the trailing None


class PlainText:
    """A text column with many distinct values (``perturbation``), kept as Arrow strings.

    Only its empty cells are needed for checking; it is stripped when the typed table
    is built (or a cell is quoted), not before.
    """

    def __init__(self, array: pa.ChunkedArray) -> None:
        self.array = array

    def at(self, row: int) -> str | None:
        return to_text(self.array[row - 1].as_py())

    def empty(self) -> np.ndarray:
        if (
            not self._may_hold_blank_text()
        ):  # the common case: the empty cells are the nulls
            return np.asarray(
                pc.is_null(self.array).to_numpy(zero_copy_only=False), dtype=bool
            )
        blank = pc.fill_null(
            pc.or_(pc.utf8_is_space(self.array), pc.equal(self.array, "")), True
        )
        return np.asarray(blank.to_numpy(zero_copy_only=False), dtype=bool)

    def _may_hold_blank_text(self) -> bool:
        """Whether some non-null cell could be "" or white space only: a length of 0, or a byte
        that is ASCII white space or control (≤ 0x20) or not ASCII at all (unicode spaces)."""
        for chunk in self.array.chunks:
            if chunk.null_count == len(chunk):
                continue
            offsets = np.frombuffer(chunk.buffers()[1], dtype=np.int32)[
                chunk.offset : chunk.offset + len(chunk) + 1
            ]
            if np.diff(offsets).min() == 0 and pc.any(pc.equal(chunk, "")).as_py():
                return True
            used = np.frombuffer(chunk.buffers()[2], dtype=np.uint8)[
                offsets[0] : offsets[-1]
            ]
            if used.size and (used.min() <= 0x20 or used.max() >= 0x80):
                return True
        return False

    def equals(self, value: str) -> np.ndarray:
        equal = pc.fill_null(pc.equal(stripped(self.array), value), False)
        return np.asarray(equal.to_numpy(zero_copy_only=False), dtype=bool)

    def objects(self) -> np.ndarray:
        return stripped(self.array).to_pandas().to_numpy(dtype=object)


def coded_text(column: pa.ChunkedArray) -> Text:
    """Codes into the distinct stripped values; each distinct value is stripped once."""
    if pa.types.is_dictionary(column.type) and pa.types.is_string(
        column.type.value_type
    ):
        encoded = (
            column.unify_dictionaries().combine_chunks()
        )  # coded by the reader already
    else:
        array = plain_strings(column)
        if not pa.types.is_string(array.type):
            array = pa.array(
                [to_text(value) for value in array.to_pylist()], pa.string()
            )
        encoded = pc.dictionary_encode(array)
    indices = (
        encoded.indices
        if encoded.indices.null_count == 0
        else pc.fill_null(encoded.indices, -1)
    )
    codes = indices.to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
    distinct = encoded.dictionary
    stripped = pc.utf8_trim_whitespace(distinct)
    empty = pc.equal(stripped, "")
    if stripped.equals(distinct) and not pc.any(empty).as_py():
        return Text(codes, distinct.to_pylist())
    # Some value had white space around it or was empty: strip, then code again (" A01" is "A01").
    recoded = pc.dictionary_encode(
        pc.if_else(empty, pa.scalar(None, pa.string()), stripped)
    )
    mapping = np.append(
        pc.fill_null(recoded.indices, -1)
        .to_numpy(zero_copy_only=False)
        .astype(np.int32),
        -1,
    )
    return Text(mapping[codes], recoded.dictionary.to_pylist())


def plain_strings(column: pa.ChunkedArray) -> pa.Array:
    array = column.combine_chunks()
    if pa.types.is_dictionary(array.type):
        array = array.cast(array.type.value_type)
    if pa.types.is_large_string(array.type):
        array = array.cast(pa.string())
    return array


def stripped(array: pa.Array) -> pa.Array:
    """Text cells stripped, empty -> null."""
    stripped = pc.utf8_trim_whitespace(array)
    return pc.if_else(pc.equal(stripped, ""), pa.scalar(None, pa.string()), stripped)


def to_text(value: Any) -> str | None:
    """A cell as stripped text; ``None`` for an empty or missing cell."""
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    if isinstance(value, (float, np.floating)):
        value = float(value)
        if math.isnan(value):
            return None
        if value.is_integer():
            return str(int(value))
    text = str(value).strip()
    return text or None
