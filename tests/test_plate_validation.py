"""Tests for cell_lane.plate_validation: one valid plate, then one test per broken rule."""

from __future__ import annotations

import io
import math
import statistics

import numpy as np
import pandas as pd
import pyarrow as pa_arrow
import pyarrow.parquet as pq
import pytest

from cell_lane.plate_validation import (
    MAX_VIOLATIONS_PER_RULE,
    OPTIONAL_COLUMNS,
    REQUIRED_COLUMNS,
    SAMPLE_TYPES,
    Z_PRIME_THRESHOLD,
    PlateFileResult,
    Violation,
    check_plate_file,
    normalised_effects,
    read_plate_table,
    validate_plate_table,
    z_prime,
)

GENES = ("CD3E", "CD4", "CD8A", "PTPRC", "IL2RA", "FOXP3")
NEG_READOUTS = (100.0, 102.0, 98.0, 101.0, 99.0, 100.0, 103.0, 97.0)
POS_READOUTS = (1000.0, 1010.0, 990.0, 1005.0, 995.0, 1000.0, 1020.0, 980.0)
CSV_FILE = "plates/p1.csv"
PARQUET_FILE = "plates/p1.parquet"


# ---------------------------------------------------------------------------
# Helpers that build valid plates
# ---------------------------------------------------------------------------


def make_plate(barcode: str = "P1", size: int = 96) -> pd.DataFrame:
    """A valid plate: column 1 neg_ctrl, last column pos_ctrl, A11-D11 empty, rest samples."""
    n_rows, n_cols = {96: (8, 12), 384: (16, 24), 1536: (32, 48)}[size]
    records = []
    sample_number = 0
    for col in range(1, n_cols + 1):
        for row_index in range(n_rows):
            letters = chr(ord("A") + row_index) if row_index < 26 else "A" + chr(ord("A") + row_index - 26)
            well = f"{letters}{col:02d}"
            if col == 1:
                record = ("neg_ctrl", "", NEG_READOUTS[row_index % 8])
            elif col == n_cols:
                record = ("pos_ctrl", "", POS_READOUTS[row_index % 8])
            elif col == n_cols - 1 and row_index < 4:
                record = ("empty", "", None)
            else:
                gene = GENES[sample_number % len(GENES)]
                record = ("sample", gene, 200.0 + 10 * (sample_number % 50))
                sample_number += 1
            sample_type, perturbation, readout = record
            records.append(
                {
                    "plate_barcode": barcode,
                    "well": well,
                    "sample_type": sample_type,
                    "perturbation": perturbation,
                    "readout": readout,
                    "concentration": 1.5 if sample_type == "sample" else None,
                    "replicate": 1,
                }
            )
    return pd.DataFrame(records)


def to_csv_bytes(frame: pd.DataFrame) -> bytes:
    return frame.to_csv(index=False).encode("utf-8")


def to_parquet_bytes(frame: pd.DataFrame) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa_arrow.Table.from_pandas(frame, preserve_index=False), sink)
    return sink.getvalue()


def as_text(frame: pd.DataFrame) -> pd.DataFrame:
    """Make every column text so that any value can be written into any cell."""
    return frame.astype(object).where(frame.notna(), "").astype(str)


def row_of(frame: pd.DataFrame, well: str, barcode: str = "P1") -> int:
    """1-based data row of a well."""
    hits = frame.index[(frame["well"] == well) & (frame["plate_barcode"] == barcode)]
    assert len(hits) == 1
    return int(hits[0]) + 1


def only(result: PlateFileResult, rule: str) -> Violation:
    """The single violation of ``rule``; fails if there are others of any rule."""
    rules = [v.rule for v in result.violations]
    assert rules == [rule], [v.describe() for v in result.violations]
    return result.violations[0]


def check_csv(frame: pd.DataFrame) -> PlateFileResult:
    return check_plate_file(to_csv_bytes(frame), CSV_FILE)


# ---------------------------------------------------------------------------
# Valid files
# ---------------------------------------------------------------------------


def test_valid_csv_passes() -> None:
    result = check_csv(make_plate())
    assert result.ok, [v.describe() for v in result.violations]
    assert result.violations == []
    assert result.plate_formats == {"P1": 96}
    assert set(result.z_primes) == {"P1"}
    assert result.z_primes["P1"] > Z_PRIME_THRESHOLD
    table = result.table
    assert table is not None
    assert len(table) == 96
    assert list(table.columns) == [*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS, "source_file", "row"]
    assert table["readout"].dtype == np.float64
    assert str(table["replicate"].dtype) == "Int64"
    assert table["row"].tolist() == list(range(1, 97))
    assert set(table["source_file"]) == {CSV_FILE}
    assert table.loc[0, "well"] == "A01"
    assert table["readout"].isna().sum() == 4  # the four empty wells


def test_valid_parquet_passes() -> None:
    plate = make_plate()
    plate["replicate"] = plate["replicate"].astype("int64")
    result = check_plate_file(to_parquet_bytes(plate), PARQUET_FILE)
    assert result.ok, [v.describe() for v in result.violations]
    assert result.plate_formats == {"P1": 96}
    assert result.table is not None and len(result.table) == 96
    csv_result = check_csv(plate)
    assert result.z_primes["P1"] == pytest.approx(csv_result.z_primes["P1"])


def test_valid_csv_with_utf8_bom_and_crlf_passes() -> None:
    data = b"\xef\xbb\xbf" + to_csv_bytes(make_plate()).replace(b"\n", b"\r\n")
    result = check_plate_file(data, CSV_FILE)
    assert result.ok, [v.describe() for v in result.violations]
    assert result.table is not None and result.table.columns[0] == "plate_barcode"


def test_optional_columns_may_be_absent() -> None:
    plate = make_plate().drop(columns=["concentration", "replicate"])
    result = check_csv(plate)
    assert result.ok
    assert "replicate" not in result.table.columns


def test_two_plates_in_one_file() -> None:
    plates = pd.concat([make_plate("P1"), make_plate("P2")], ignore_index=True)
    result = check_csv(plates)
    assert result.ok, [v.describe() for v in result.violations]
    assert result.plate_formats == {"P1": 96, "P2": 96}
    assert set(result.z_primes) == {"P1", "P2"}


def test_384_well_plate_is_recognised() -> None:
    result = check_csv(make_plate(size=384))
    assert result.ok, [v.describe() for v in result.violations]
    assert result.plate_formats == {"P1": 384}
    assert len(result.table) == 384


def test_1536_well_plate_is_recognised() -> None:
    result = check_csv(make_plate(size=1536))
    assert result.ok, [v.describe() for v in result.violations]
    assert result.plate_formats == {"P1": 1536}
    assert len(result.table) == 1536 and result.table["well"].iloc[-1] == "AF48"


def test_quoted_fields_with_commas_and_line_breaks_are_read_and_lines_stay_true() -> None:
    plate = as_text(make_plate())
    plate.loc[1, "perturbation"] = "CD3E, CD28"  # pandas quotes it: "CD3E, CD28"
    plate.loc[2, "perturbation"] = "CD4\nlow"  # a quoted value spanning two lines
    plate.loc[9, "readout"] = "n.d."  # data row 10: line 12, after the two-line record
    result = check_csv(plate)
    v = only(result, "non_numeric_readout")
    assert v.row == 10 and "line 12" in v.message
    plate.loc[9, "readout"] = "100"
    result = check_csv(plate)
    assert result.ok, [v.describe() for v in result.violations]
    assert result.table.loc[1, "perturbation"] == "CD3E, CD28"
    assert result.table.loc[2, "perturbation"] == "CD4\nlow"


def test_cells_are_stripped_and_numbers_spelt_otherwise_still_count() -> None:
    plate = as_text(make_plate())
    plate["plate_barcode"] = " P1 "
    plate.loc[0, "concentration"] = "NaN"  # a missing concentration, as a spreadsheet writes it
    plate.loc[20, "readout"] = "2.5e2"
    plate.loc[21, "readout"] = " 7 "
    result = check_csv(plate)
    assert result.ok, [v.describe() for v in result.violations]
    assert set(result.table["plate_barcode"]) == {"P1"}
    assert result.plate_formats == {"P1": 96}
    assert result.table.loc[20, "readout"] == 250.0 and result.table.loc[21, "readout"] == 7.0
    assert np.isnan(result.table.loc[0, "concentration"])


def test_mixed_plate_formats_in_one_file() -> None:
    plates = pd.concat([make_plate("P1"), make_plate("P2", size=384)], ignore_index=True)
    v = only(check_csv(plates), "mixed_plate_format")
    assert v.row is None
    assert "P1" in v.message and "P2" in v.message and "384" in v.message


# ---------------------------------------------------------------------------
# Reading problems
# ---------------------------------------------------------------------------


def test_unsupported_file_type() -> None:
    table, violations = read_plate_table(b"anything", "plates/p1.xlsx")
    assert table is None
    assert [v.rule for v in violations] == ["unsupported_file_type"]
    assert ".csv" in violations[0].message and ".parquet" in violations[0].message


def test_utf16_is_an_encoding_violation() -> None:
    data = make_plate().to_csv(index=False).encode("utf-16")
    v = only(check_plate_file(data, CSV_FILE), "encoding")
    assert "UTF-16" in v.message and "UTF-8" in v.message
    assert "byte offset 0" in v.message


def test_utf16_without_bom_is_an_encoding_violation() -> None:
    data = make_plate().to_csv(index=False).encode("utf-16-le")
    v = only(check_plate_file(data, CSV_FILE), "encoding")
    assert "byte offset 1" in v.message and "UTF-8" in v.message


def test_latin1_is_an_encoding_violation_with_byte_offset() -> None:
    plate = make_plate()
    plate.loc[10, "perturbation"] = "Gène"
    data = plate.to_csv(index=False).encode("latin-1")
    offset = data.index(b"\xe8")
    v = only(check_plate_file(data, CSV_FILE), "encoding")
    assert f"byte offset {offset}" in v.message
    assert "line 12" in v.message  # data row 11 is on line 12
    assert "0xE8" in v.message and "UTF-8" in v.message


def test_semicolon_delimiter() -> None:
    data = make_plate().to_csv(index=False, sep=";").encode("utf-8")
    result = check_plate_file(data, CSV_FILE)
    v = only(result, "delimiter")
    assert "';'" in v.message and "comma" in v.message
    assert result.table is None


def test_tab_delimiter() -> None:
    data = make_plate().to_csv(index=False, sep="\t").encode("utf-8")
    v = only(check_plate_file(data, CSV_FILE), "delimiter")
    assert "tab" in v.message


def test_ragged_row_is_malformed_csv_with_line_number() -> None:
    lines = to_csv_bytes(make_plate()).decode().splitlines()
    lines[5] += ",extra"  # data row 5 sits on line 6
    result = check_plate_file("\n".join(lines).encode(), CSV_FILE)
    v = only(result, "malformed_csv")
    assert v.row == 5
    assert "line 6" in v.message
    assert "8 fields" in v.message and "header has 7" in v.message
    assert result.table is None


def test_unclosed_quote_is_malformed_csv() -> None:
    lines = to_csv_bytes(make_plate()).decode().splitlines()
    lines[3] = lines[3].replace("neg_ctrl", '"neg_ctrl"x', 1)
    v = only(check_plate_file("\n".join(lines).encode(), CSV_FILE), "malformed_csv")
    assert v.row == 3
    assert "Line 4" in v.message


def test_empty_file() -> None:
    for data in (b"", b"\n\n  \n"):
        v = only(check_plate_file(data, CSV_FILE), "empty_file")
        assert v.row is None
    v = only(check_plate_file(b"", PARQUET_FILE), "empty_file")


def test_header_only_file() -> None:
    data = (",".join(REQUIRED_COLUMNS) + "\n").encode()
    v = only(check_plate_file(data, CSV_FILE), "empty_file")
    assert "no data rows" in v.message


def test_parquet_without_rows_is_empty() -> None:
    data = to_parquet_bytes(make_plate().iloc[0:0])
    v = only(check_plate_file(data, PARQUET_FILE), "empty_file")
    assert "no rows" in v.message


def test_truncated_parquet_is_unreadable() -> None:
    data = to_parquet_bytes(make_plate())
    result = check_plate_file(data[: len(data) // 2], PARQUET_FILE)
    v = only(result, "unreadable_parquet")
    assert result.table is None
    assert "cannot be read" in v.message
    assert len(v.message) > len("The Parquet file cannot be read: .")  # carries pyarrow's reason


def test_blank_lines_are_skipped_but_line_numbers_stay_true() -> None:
    plate = as_text(make_plate())
    plate.loc[4, "readout"] = "n.d."  # data row 5
    lines = to_csv_bytes(plate).decode().splitlines()
    lines.insert(2, "")  # a blank line after data row 1 shifts row 5 to line 7
    v = only(check_plate_file("\n".join(lines).encode(), CSV_FILE), "non_numeric_readout")
    assert v.row == 5
    assert "line 7" in v.message


# ---------------------------------------------------------------------------
# Column problems
# ---------------------------------------------------------------------------


def test_missing_column() -> None:
    result = check_csv(make_plate().drop(columns=["readout"]))
    v = only(result, "missing_column")
    assert v.column == "readout"
    assert "'readout'" in v.message
    assert result.z_primes == {}


def test_missing_column_suggests_a_misspelt_header() -> None:
    result = check_csv(make_plate().rename(columns={"well": "Well"}))
    by_rule = {v.rule: v for v in result.violations}
    assert set(by_rule) == {"missing_column", "extra_column"}
    assert by_rule["missing_column"].column == "well"
    assert "rename it to 'well'" in by_rule["missing_column"].message
    assert by_rule["extra_column"].column == "Well"


def test_extra_column() -> None:
    plate = make_plate()
    plate["notes"] = "ok"
    v = only(check_csv(plate), "extra_column")
    assert v.column == "notes"
    assert "'notes'" in v.message
    for column in (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS):
        assert column in v.message


def test_duplicate_column() -> None:
    lines = to_csv_bytes(make_plate()).decode().splitlines()
    lines = [line + "," + line.split(",")[4] for line in lines]  # repeat 'readout'
    v = only(check_plate_file("\n".join(lines).encode(), CSV_FILE), "duplicate_column")
    assert v.column == "readout"
    assert "columns 5 and 8" in v.message


# ---------------------------------------------------------------------------
# Cell problems
# ---------------------------------------------------------------------------


def test_non_numeric_readout() -> None:
    plate = as_text(make_plate())
    row = row_of(plate, "C05")
    plate.loc[row - 1, "readout"] = "n.d."
    v = only(check_csv(plate), "non_numeric_readout")
    assert (v.row, v.well, v.column, v.plate_barcode) == (row, "C05", "readout", "P1")
    assert "'n.d.'" in v.message
    assert f"line {row + 1}" in v.message


def test_decimal_comma_gets_a_hint() -> None:
    plate = as_text(make_plate())
    plate.loc[20, "readout"] = "12,5"
    v = only(check_csv(plate), "non_numeric_readout")
    assert v.row == 21
    assert "'12.5'" in v.message


def test_non_numeric_readout_in_parquet() -> None:
    plate = as_text(make_plate())
    plate.loc[30, "readout"] = "OVER"
    v = only(check_plate_file(to_parquet_bytes(plate), PARQUET_FILE), "non_numeric_readout")
    assert (v.row, v.well) == (31, plate.loc[30, "well"])
    assert "'OVER'" in v.message
    assert "line" not in v.message  # Parquet has no lines


def test_missing_readout_on_a_sample() -> None:
    plate = make_plate()
    row = row_of(plate, "D07")
    plate.loc[row - 1, "readout"] = None
    v = only(check_csv(plate), "missing_value")
    assert (v.row, v.well, v.column) == (row, "D07", "readout")
    assert "readout" in v.message and "empty" in v.message


def test_missing_readout_written_as_na() -> None:
    plate = as_text(make_plate())
    plate.loc[40, "readout"] = "NA"
    v = only(check_csv(plate), "missing_value")
    assert (v.row, v.column) == (41, "readout")
    assert "'NA'" in v.message


def test_missing_perturbation_on_a_sample() -> None:
    plate = make_plate()
    row = row_of(plate, "B02")
    plate.loc[row - 1, "perturbation"] = ""
    v = only(check_csv(plate), "missing_value")
    assert (v.row, v.well, v.column) == (row, "B02", "perturbation")


def test_missing_plate_barcode() -> None:
    plate = make_plate()
    plate.loc[50, "plate_barcode"] = ""
    v = only(check_csv(plate), "missing_value")
    assert (v.row, v.column, v.well) == (51, "plate_barcode", plate.loc[50, "well"])


def test_negative_readout() -> None:
    plate = make_plate()
    row = row_of(plate, "E03")
    plate.loc[row - 1, "readout"] = -5.0
    v = only(check_csv(plate), "out_of_range")
    assert (v.row, v.well, v.column) == (row, "E03", "readout")
    assert "'-5.0'" in v.message and "negative" in v.message


def test_infinite_readout() -> None:
    plate = as_text(make_plate())
    plate.loc[60, "readout"] = "inf"
    v = only(check_csv(plate), "out_of_range")
    assert (v.row, v.column) == (61, "readout")
    assert "finite" in v.message and "'inf'" in v.message


def test_negative_concentration() -> None:
    plate = make_plate()
    plate.loc[12, "concentration"] = -1.0
    v = only(check_csv(plate), "out_of_range")
    assert (v.row, v.column) == (13, "concentration")


@pytest.mark.parametrize("value", ["0", "1.5", "-2"])
def test_bad_replicate(value: str) -> None:
    plate = as_text(make_plate())
    plate.loc[14, "replicate"] = value
    v = only(check_csv(plate), "out_of_range")
    assert (v.row, v.column) == (15, "replicate")
    assert repr(value) in v.message


def test_non_numeric_replicate() -> None:
    plate = as_text(make_plate())
    plate.loc[14, "replicate"] = "first"
    v = only(check_csv(plate), "non_numeric_value")
    assert (v.row, v.column) == (15, "replicate")
    assert "'first'" in v.message


@pytest.mark.parametrize(("bad", "suggestion"), [("Z99", None), ("A1", "A01"), ("a05", "A05")])
def test_invalid_well(bad: str, suggestion: str | None) -> None:
    plate = make_plate()
    row = row_of(plate, "F04")
    plate.loc[row - 1, "well"] = bad
    v = only(check_csv(plate), "invalid_well")
    assert (v.row, v.well, v.column) == (row, bad, "well")
    assert repr(bad) in v.message
    if suggestion:
        assert f"did you mean '{suggestion}'" in v.message
    else:
        assert "did you mean" not in v.message


@pytest.mark.parametrize("outside", ["Q01", "A25"])
def test_well_outside_plate(outside: str) -> None:
    plate = make_plate()
    row = row_of(plate, "G06")
    plate.loc[row - 1, "well"] = outside
    result = check_csv(plate)
    v = only(result, "well_outside_plate")
    assert (v.row, v.well, v.column) == (row, outside, "well")
    assert outside in v.message and "P24" in v.message
    assert result.plate_formats == {"P1": 96}


def test_well_outside_plate_without_a_barcode_column() -> None:
    plate = make_plate().drop(columns=["plate_barcode"])
    plate.loc[5, "well"] = "Q01"
    result = check_csv(plate)
    assert sorted(v.rule for v in result.violations) == ["missing_column", "well_outside_plate"]
    assert next(v for v in result.violations if v.rule == "well_outside_plate").row == 6


def test_unknown_sample_type() -> None:
    plate = make_plate()
    row = row_of(plate, "H08")
    plate.loc[row - 1, "sample_type"] = "control"
    v = only(check_csv(plate), "unknown_sample_type")
    assert (v.row, v.well, v.column) == (row, "H08", "sample_type")
    assert "'control'" in v.message
    for sample_type in SAMPLE_TYPES:
        assert sample_type in v.message


def test_unknown_sample_type_suggests_spelling() -> None:
    plate = make_plate()
    plate.loc[0, "sample_type"] = "Neg_Ctrl"
    v = only(check_csv(plate), "unknown_sample_type")
    assert v.row == 1
    assert "did you mean 'neg_ctrl'" in v.message


# ---------------------------------------------------------------------------
# Plate problems
# ---------------------------------------------------------------------------


def test_duplicate_well_names_both_rows() -> None:
    plate = make_plate()
    first = row_of(plate, "B03")
    second = row_of(plate, "C09")
    plate.loc[second - 1, "well"] = "B03"
    v = only(check_csv(plate), "duplicate_well")
    assert (v.row, v.well, v.column, v.plate_barcode) == (second, "B03", "well", "P1")
    assert f"rows {first} and {second}" in v.message
    assert f"lines {first + 1} and {second + 1}" in v.message


def test_same_well_on_two_plates_is_not_a_duplicate() -> None:
    plates = pd.concat([make_plate("P1"), make_plate("P2")], ignore_index=True)
    assert check_csv(plates).ok


def test_missing_positive_controls() -> None:
    plate = make_plate()
    pos_rows = plate.index[plate["sample_type"] == "pos_ctrl"]
    plate.loc[pos_rows[1:], "sample_type"] = "sample"  # keep one pos_ctrl
    plate.loc[pos_rows[1:], "perturbation"] = "CD3E"
    result = check_csv(plate)
    v = only(result, "missing_controls")
    assert (v.row, v.plate_barcode, v.column) == (None, "P1", "sample_type")
    assert "pos_ctrl" in v.message and "has 1" in v.message
    assert result.z_primes == {}


def test_controls_without_readouts_do_not_count() -> None:
    plate = make_plate()
    neg_rows = plate.index[plate["sample_type"] == "neg_ctrl"]
    plate.loc[neg_rows, "sample_type"] = "empty"
    plate.loc[neg_rows[:2], "sample_type"] = "neg_ctrl"
    plate.loc[neg_rows[:2], "readout"] = None
    result = check_csv(plate)
    rules = sorted(v.rule for v in result.violations)
    assert rules == ["missing_controls", "missing_value", "missing_value"]
    controls = next(v for v in result.violations if v.rule == "missing_controls")
    assert "neg_ctrl" in controls.message and "has 0" in controls.message


# ---------------------------------------------------------------------------
# Z' and normalised effects
# ---------------------------------------------------------------------------


def test_z_prime_matches_hand_calculation() -> None:
    # pos mean 11, sd sqrt(2); neg mean 2, sd sqrt(2): 1 - 3 * 2*sqrt(2) / 9
    assert z_prime([10, 12], [1, 3]) == pytest.approx(1 - 6 * math.sqrt(2) / 9)
    assert z_prime([10, 12], [1, 3]) == pytest.approx(0.0571909584)
    assert z_prime([5, 5], [1, 1]) == 1.0
    assert z_prime([1, 2], [2, 1]) == -math.inf
    with pytest.raises(ValueError):
        z_prime([1.0], [1.0, 2.0])


def test_plate_z_prime_uses_the_control_readouts() -> None:
    result = check_csv(make_plate())
    pos_sd = statistics.stdev(POS_READOUTS)
    neg_sd = statistics.stdev(NEG_READOUTS)
    window = abs(statistics.mean(POS_READOUTS) - statistics.mean(NEG_READOUTS))
    assert result.z_primes["P1"] == pytest.approx(1 - 3 * (pos_sd + neg_sd) / window)


def test_low_z_prime_is_not_a_violation() -> None:
    plate = make_plate()
    pos_rows = plate.index[plate["sample_type"] == "pos_ctrl"]
    plate.loc[pos_rows, "readout"] = [100.0, 300.0] * 4  # overlaps the negatives
    result = check_csv(plate)
    assert result.ok
    assert result.z_primes["P1"] < Z_PRIME_THRESHOLD


def test_normalised_effects_maps_controls_to_0_and_1() -> None:
    plate = make_plate()
    neg_mean = statistics.mean(NEG_READOUTS)
    pos_mean = statistics.mean(POS_READOUTS)
    plate.loc[row_of(plate, "A02") - 1, "readout"] = neg_mean
    plate.loc[row_of(plate, "B02") - 1, "readout"] = pos_mean
    plate.loc[row_of(plate, "C02") - 1, "readout"] = (neg_mean + pos_mean) / 2
    result = check_csv(plate)
    assert result.ok
    effects = normalised_effects(result.table)
    assert list(effects.columns) == [
        "plate_barcode", "well", "perturbation", "replicate", "readout", "effect", "source_file"
    ]
    assert len(effects) == int((plate["sample_type"] == "sample").sum())
    by_well = effects.set_index("well")["effect"]
    assert by_well["A02"] == pytest.approx(0.0)
    assert by_well["B02"] == pytest.approx(1.0)
    assert by_well["C02"] == pytest.approx(0.5)
    assert set(effects["source_file"]) == {CSV_FILE}


def test_normalised_effects_is_per_plate() -> None:
    second = make_plate("P2")
    second["readout"] = second["readout"] * 2  # same layout, doubled signal
    result = check_csv(pd.concat([make_plate("P1"), second], ignore_index=True))
    assert result.ok
    effects = normalised_effects(result.table)
    p1 = effects[effects.plate_barcode == "P1"].set_index("well")["effect"]
    p2 = effects[effects.plate_barcode == "P2"].set_index("well")["effect"]
    pd.testing.assert_series_equal(p1, p2)


# ---------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------


def test_violation_cap() -> None:
    plate = as_text(make_plate())
    samples = plate.index[plate["sample_type"] == "sample"][:50]
    plate.loc[samples, "readout"] = "n.d."
    result = check_csv(plate)
    readout_problems = [v for v in result.violations if v.rule == "non_numeric_readout"]
    assert len(readout_problems) == MAX_VIOLATIONS_PER_RULE + 1
    listed, summary = readout_problems[:-1], readout_problems[-1]
    assert [v.row for v in listed] == [int(i) + 1 for i in samples[:MAX_VIOLATIONS_PER_RULE]]
    assert summary.row is None
    assert "and 30 more" in summary.message and "50 in total" in summary.message
    assert [v.rule for v in result.violations] == ["non_numeric_readout"] * 21


def test_violation_cap_counts_one_rule_found_by_two_checks() -> None:
    plate = as_text(make_plate())
    samples = plate.index[plate["sample_type"] == "sample"]
    plate.loc[samples[:15], "plate_barcode"] = ""  # missing_value on plate_barcode
    plate.loc[samples[40:55], "readout"] = ""  # missing_value on readout
    result = check_csv(plate)
    missing = [v for v in result.violations if v.rule == "missing_value"]
    listed, summary = missing[:-1], missing[-1]
    expected = sorted([int(i) + 1 for i in samples[:15]] + [int(i) + 1 for i in samples[40:55]])[:MAX_VIOLATIONS_PER_RULE]
    assert [v.row for v in listed] == expected
    assert "and 10 more" in summary.message and "30 in total" in summary.message


def test_describe_and_to_dict() -> None:
    v = Violation(
        file="plates/p1.csv",
        rule="non_numeric_readout",
        message="Readout 'x' is not a number.",
        row=12,
        well="B03",
        column="readout",
        plate_barcode="P1",
    )
    assert v.describe() == (
        "plates/p1.csv row 12 (well B03, column readout): non_numeric_readout — "
        "Readout 'x' is not a number."
    )
    assert v.to_dict() == {
        "file": "plates/p1.csv",
        "rule": "non_numeric_readout",
        "message": "Readout 'x' is not a number.",
        "row": 12,
        "well": "B03",
        "column": "readout",
        "plate_barcode": "P1",
    }
    plate_level = Violation(file="f.csv", rule="missing_controls", message="m", plate_barcode="P9")
    assert plate_level.describe() == "f.csv (plate P9): missing_controls — m"


def test_validate_plate_table_accepts_a_dataframe() -> None:
    result = validate_plate_table(make_plate(), PARQUET_FILE)
    assert result.ok, [v.describe() for v in result.violations]
    assert result.file == PARQUET_FILE
    assert result.plate_formats == {"P1": 96}


def test_big_files_check_their_plate_rules_on_a_second_thread_with_the_same_result(monkeypatch: pytest.MonkeyPatch) -> None:
    from cell_lane.plate_validation import validate

    plates = as_text(pd.concat([make_plate("P1"), make_plate("P2", size=384)], ignore_index=True))
    plates.loc[3, "well"] = "A1"  # invalid_well (plate rules)
    plates.loc[7, "readout"] = "n.d."  # non_numeric_readout (cell rules)
    plates.loc[9, "well"] = plates.loc[10, "well"]  # duplicate_well (plate rules)
    serial = check_csv(plates)
    monkeypatch.setattr(validate, "PARALLEL_ROWS", 1)
    parallel = check_csv(plates)
    assert [v.describe() for v in parallel.violations] == [v.describe() for v in serial.violations]
    assert {v.rule for v in serial.violations} >= {"invalid_well", "non_numeric_readout", "duplicate_well", "mixed_plate_format"}
    assert parallel.plate_formats == serial.plate_formats and parallel.z_primes == serial.z_primes


def test_a_1536_well_plate_beside_a_row_without_barcode() -> None:
    plate = make_plate(size=1536)
    plate.loc[1000, "plate_barcode"] = ""  # this row's well (beyond P24) is on no plate of 1536 wells
    result = check_csv(plate)
    assert sorted(v.rule for v in result.violations) == ["missing_value", "well_outside_plate"]
    assert result.plate_formats == {"P1": 1536}
