"""Users' own tables: CSV or Parquet files with named columns (pyarrow reads them).

* A **feature table** holds numeric feature columns and a label column; it becomes the
  arrays of an ``npz`` dataset (``x``, ``y``, ``class_names``), optionally standardised
  (with the training split's mean and standard deviation, recorded in the preprocessing
  and applied again at serve time).
* A **text table** holds a text column and a label column; it trains as ``"dataset":
  "text"`` with the same word vectors and tokenizer as AG News.

Labels may be strings or numbers; their sorted distinct values become the class names.
Every problem is a ``ValueError`` that names the row and column, or the class (rows
count from 1, the header not included).
"""

from __future__ import annotations

import csv
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from corel.data.splits import split_codes

__all__ = ["DELIMITERS", "LABEL_NAMES", "TEXT_NAMES", "delimiter_of", "feature_table", "read_table",
           "text_table", "texts_of_rows"]

LABEL_NAMES = ("label", "labels", "class", "target", "y", "category", "topic")
TEXT_NAMES = ("text", "body", "content", "document", "description", "sentence")
MIN_PER_CLASS = 3  # one sample for each of the train, validation and test splits
# What separates a CSV's cells: commas, or what spreadsheets write in locales whose decimal
# mark is a comma (semicolons), tabs (a TSV saved as .csv), and bars.
DELIMITERS = (",", ";", "\t", "|")
_DECIMAL_COMMA = re.compile(r"[+-]?\d+,\d+")


def delimiter_of(header: str) -> str:
    """The delimiter of a CSV whose header line is ``header``: of :data:`DELIMITERS`, the
    one that splits it into the most cells (quotes respected); a comma where none splits it."""
    best, most = ",", 1
    for d in DELIMITERS:
        cells = len(next(csv.reader([header], delimiter=d), []))
        if cells > most:
            best, most = d, cells
    return best


def _header_line(path: Path) -> str:
    with path.open("rb") as fh:
        return fh.readline(1 << 16).decode("utf-8-sig", errors="replace").rstrip("\r\n")


def read_table(path: str | Path, fmt: str | None = None) -> Any:
    """A pyarrow Table from a CSV (a header row, cells separated by any one of
    :data:`DELIMITERS`, told by the header) or Parquet file."""
    try:
        import pyarrow as pa
        import pyarrow.csv as pcsv
        import pyarrow.parquet as pq
    except ImportError as exc:  # pragma: no cover - pyarrow comes with the text extra
        raise ImportError("tables need pyarrow: pip install 'corel[text]'") from exc
    p = Path(path)
    fmt = fmt or ("parquet" if p.suffix.lower() in (".parquet", ".pq") else "csv")
    try:
        # Only an empty cell is missing: "n/a" or "NaN" is a value, and a bad one is named.
        convert = pcsv.ConvertOptions(null_values=[""], strings_can_be_null=True)
        if fmt == "parquet":
            table = pq.read_table(p)
        else:
            parse = pcsv.ParseOptions(delimiter=delimiter_of(_header_line(p)))
            table = pcsv.read_csv(p, parse_options=parse, convert_options=convert)
    except (pa.ArrowException, OSError) as exc:  # every Arrow error, of whatever base
        raise ValueError(f"not a readable {fmt} table: {exc}") from exc
    if table.num_rows == 0:
        raise ValueError("the table has no rows")
    names = table.column_names
    if len(names) == 1:  # no table trains from one column: its cells are not separated
        raise ValueError(
            f"the table has one column, {names[0]!r}: a table needs a label column and at least "
            "one other, their cells separated by commas, semicolons, tabs or | (the header "
            "row's separator is taken for the whole file)")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"column name(s) {', '.join(map(repr, dup))} appear more than once")
    return table


def _pick(table: Any, given: str | None, candidates: Sequence[str], what: str,
          exclude: Sequence[str] = ()) -> str:
    names = [n for n in table.column_names if n not in exclude]
    if given is not None:
        if given not in table.column_names:
            raise ValueError(f"no column {given!r} for the {what}; the columns are "
                             f"{', '.join(map(repr, table.column_names))}")
        return given
    found = [n for n in names if n.strip().lower() in candidates]
    if len(found) == 1:
        return found[0]
    raise ValueError(
        f"cannot tell which column holds the {what} (columns: "
        f"{', '.join(map(repr, table.column_names))}); name it with {what.replace(' ', '_')}_column"
        if not found else
        f"several columns could hold the {what} ({', '.join(map(repr, found))}); name one with "
        f"{what.replace(' ', '_')}_column")


def pick_label(table: Any, given: str | None = None, exclude: Sequence[str] = ()) -> str:
    """The label column: ``given``; or the one named like a label (label, class, target,
    ...); or else, in a table whose other columns are all numeric, its one column of words
    (iris's ``species``)."""
    try:
        return _pick(table, given, LABEL_NAMES, "label", exclude)
    except ValueError:
        names = [n for n in table.column_names if n not in exclude]
        if given is not None or any(n.strip().lower() in LABEL_NAMES for n in names):
            raise
        words = [n for n in names if not looks_numeric(table, n)]
        if len(words) == 1 and len(names) > 1:
            return words[0]
        raise


def _labels(table: Any, column: str) -> tuple[np.ndarray, list[str]]:
    values = table.column(column).to_pylist()
    empty = [i for i, v in enumerate(values) if v is None or (isinstance(v, str) and not v.strip())]
    if empty:
        raise ValueError(f"column {column!r}, row {empty[0] + 1}: the label is empty")
    names_of = [str(v).strip() for v in values]
    # Numeric labels sort as numbers (2 before 10), others as text.
    try:
        order = sorted(set(names_of), key=float)
    except ValueError:
        order = sorted(set(names_of))
    if len(order) < 2:
        raise ValueError(f"column {column!r} holds one class ({order[0]!r}); at least 2 are needed")
    index = {name: i for i, name in enumerate(order)}
    y = np.fromiter((index[n] for n in names_of), dtype=np.int64, count=len(names_of))
    counts = np.bincount(y, minlength=len(order))
    small = [f"{order[c]!r} ({counts[c]})" for c in range(len(order)) if counts[c] < MIN_PER_CLASS]
    if small:
        raise ValueError(
            f"column {column!r}: every class needs at least {MIN_PER_CLASS} rows (one for each "
            f"split), but these have fewer: {', '.join(small)}; add rows or drop the class")
    return y, order


def _numeric(table: Any, column: str) -> np.ndarray:
    import pyarrow as pa

    col = table.column(column)
    if pa.types.is_integer(col.type) or pa.types.is_floating(col.type) or pa.types.is_boolean(col.type):
        values = col.to_numpy(zero_copy_only=False)
        if col.null_count:
            row = next(i for i, v in enumerate(col.to_pylist()) if v is None)
            raise ValueError(f"column {column!r}, row {row + 1}: the value is empty")
        out = np.asarray(values, dtype=np.float64)
    else:
        out = np.empty(len(col), dtype=np.float64)
        for i, v in enumerate(col.to_pylist()):
            try:
                out[i] = float(v)
            except (TypeError, ValueError):
                shown = "empty" if v is None or str(v).strip() == "" else f"{str(v)[:40]!r}, not a number"
                if isinstance(v, str) and _DECIMAL_COMMA.fullmatch(v.strip()):
                    shown += f": write decimals with a point ({v.strip().replace(',', '.')})"
                raise ValueError(f"column {column!r}, row {i + 1}: the value is {shown}; "
                                 "feature columns must be numeric") from None
    bad = np.flatnonzero(~np.isfinite(out))
    if bad.size:
        raise ValueError(f"column {column!r}, row {int(bad[0]) + 1}: the value is not finite")
    return out


def looks_numeric(table: Any, column: str, share: float = 0.9) -> bool:
    """A numeric column, or one whose non-empty values are numbers but for a few typos
    (at least ``share`` of them): a feature column to be diagnosed cell by cell, not text."""
    import pyarrow as pa

    col = table.column(column)
    if pa.types.is_integer(col.type) or pa.types.is_floating(col.type) or pa.types.is_boolean(col.type):
        return True
    values = [v for v in col.to_pylist() if v is not None and str(v).strip()]
    numbers = 0
    for v in values:
        try:
            float(v)
        except (TypeError, ValueError):
            continue
        numbers += 1
    return bool(values) and numbers >= share * len(values)


def _split_of(table: Any, split_column: str | None) -> dict[str, Any]:
    if split_column is None:
        return {}
    if split_column not in table.column_names:
        raise ValueError(f"no column {split_column!r} for the split; the columns are "
                         f"{', '.join(map(repr, table.column_names))}")
    return {"split": split_codes(table.column(split_column).to_pylist(), split_column)}


def feature_table(table: Any, label_column: str | None = None,
                  split_column: str | None = None) -> dict[str, Any]:
    """``{"x": float32 (N, D), "y": int64 (N,), "class_names", "feature_names"[, "split"]}``."""
    label = pick_label(table, label_column, (split_column,) if split_column else ())
    features = [n for n in table.column_names if n not in (label, split_column)]
    if not features:
        raise ValueError(f"the table has no feature column besides the label {label!r}")
    y, names = _labels(table, label)
    x = np.column_stack([_numeric(table, c) for c in features]).astype(np.float32)
    return {"x": x, "y": y, "class_names": names, "feature_names": features, "label_column": label,
            **_split_of(table, split_column)}


def text_table(table: Any, text_column: str | None = None, label_column: str | None = None,
               split_column: str | None = None) -> dict[str, Any]:
    """``{"texts": list[str], "y": int64 (N,), "class_names"[, "split"]}``."""
    label = pick_label(table, label_column, (split_column,) if split_column else ())
    rest = [n for n in table.column_names if n not in (label, split_column)]
    if text_column is None and len(rest) == 1:
        text_column = rest[0]
    text = _pick(table, text_column, TEXT_NAMES, "text", exclude=(label,))
    if text == label:
        raise ValueError(f"the text and the label cannot be the same column ({text!r})")
    y, names = _labels(table, label)
    texts = table.column(text).to_pylist()
    for i, t in enumerate(texts):
        if t is None or not str(t).strip():
            raise ValueError(f"column {text!r}, row {i + 1}: the text is empty")
    return {"texts": [str(t) for t in texts], "y": y, "class_names": names,
            "text_column": text, "label_column": label, **_split_of(table, split_column)}


def to_npz(arrays: dict[str, Any]) -> bytes:
    """The .npz a dataset loader reads: ``x, y, class_names, feature_names[, standardize]``
    (features) or ``texts, y, class_names`` (texts); strings as fixed-width unicode, no
    pickles."""
    import io

    buf = io.BytesIO()
    out: dict[str, Any] = {k: np.asarray(v) if k != "texts" else np.asarray(v, dtype=np.str_)
                           for k, v in arrays.items() if k in ("x", "y", "texts", "standardize", "split")}
    out["class_names"] = np.asarray(arrays["class_names"], dtype=np.str_)
    if "feature_names" in arrays:
        out["feature_names"] = np.asarray(arrays["feature_names"], dtype=np.str_)
    np.savez(buf, **out)
    return buf.getvalue()


def _text_columns(columns: Sequence[str], text_column: str | None) -> list[str]:
    """Which of ``columns`` make a row's text (see :func:`texts_of_rows`)."""
    if text_column is not None and text_column in columns:
        return [text_column]
    by_name = {c.strip().lower(): c for c in columns}
    if "title" in by_name and "description" in by_name:
        return [by_name["title"], by_name["description"]]
    rest = [c for c in columns if c.strip().lower() not in LABEL_NAMES]
    if len(rest) == 1:
        return rest
    named = [c for c in rest if c.strip().lower() in TEXT_NAMES]
    if len(named) == 1:
        return named
    trained = f"{text_column!r} (the column the model trained from), " if text_column else ""
    raise ValueError(
        f"cannot tell which column holds the texts (columns: {', '.join(map(repr, columns))}); "
        f"send one column besides a label, or name it {trained}{' or '.join(TEXT_NAMES)}, or "
        "send AG News's title and description")


def texts_of_rows(rows: Sequence[Mapping[str, Any]], text_column: str | None = None) -> list[str]:
    """The texts of rows given by column name (a CSV of new texts for a text model, as a
    feature model takes a CSV of its rows): the column ``text_column`` (the one the model's
    table trained from) where the rows have it; else AG News's title and description,
    joined by a space as AG News trains; else the one column that is not named like a label;
    else the one named like a text (:data:`TEXT_NAMES`). An empty cell is an empty text."""
    if not rows:
        return []
    columns = _text_columns(list(rows[0]), text_column)
    texts = []
    for i, row in enumerate(rows):
        parts = []
        for column in columns:
            if column not in row:
                raise ValueError(f"input {i}: no column {column!r}, which input 0 takes the text from")
            value = row[column]
            if value is not None and not isinstance(value, str):
                raise ValueError(f"input {i}, column {column!r}: {value!r} is not a text")
            parts.append(value or "")
        texts.append(" ".join(parts))
    return texts
