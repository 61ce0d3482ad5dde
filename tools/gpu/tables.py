"""Reading what tools/gpu/run.sh wrote: files, the Markdown tables the
benchmarks print, unittest logs, and the cells summarize.py writes.
Standard library only."""

import re


def read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def md_tables(text):
    """{heading: [row dicts]} for every Markdown table in `text`; a table's
    heading is the nearest line above it starting with '#' ('' if none)."""
    tables, heading, header, rows = {}, "", None, None
    for line in (text or "").splitlines() + [""]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if header is None:
                header, rows = cells, []
            elif set("".join(cells)) <= set("-:"):
                continue
            else:
                rows.append(dict(zip(header, cells)))
            continue
        if header is not None:
            tables.setdefault(heading, rows)
            header = None
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
    return tables


def table_under(text, prefix):
    """The rows of the first table whose heading starts with `prefix`."""
    for heading, rows in md_tables(text).items():
        if heading.startswith(prefix):
            return rows
    return []


def num(cell):
    try:
        return float(cell)
    except (TypeError, ValueError):
        return None


def spread(cell):
    """(min, median, max) of a 'min / median / max' cell, Nones if absent."""
    parts = [num(v.strip()) for v in (cell or "").split("/")]
    return tuple(parts) if len(parts) == 3 else (None, None, None)


def unittest_outcome(text):
    """(tests run or None, whether all passed) from a unittest log."""
    ran = re.search(r"^Ran (\d+) tests?", text or "", re.M)
    failed = re.search(r"^FAILED \((.*)\)", text or "", re.M)
    return (int(ran.group(1)) if ran else None,
            bool(ran) and failed is None and
            re.search(r"^OK", text or "", re.M) is not None)


def fmt(v, spec=".2f"):
    return "n/a" if v is None else format(v, spec)


def verdict(value, target, higher_is_better=False):
    if value is None:
        return "not measured"
    ok = value >= target if higher_is_better else value <= target
    return "met" if ok else "missed"
