#!/usr/bin/env python3
"""Draws the plots of docs/benchmarks.md from the tables on that page.

usage: scripts/benchmark-plots.py [--check] [--doc docs/benchmarks.md] [--out docs/img]

Each table to plot follows a marker line (blank lines between them are allowed):

    <!-- plot: AREA | LABEL COLUMN[; LABEL COLUMN] | VALUE COLUMN[; VALUE COLUMN] [| Y AXIS] -->

and becomes OUT/bench-AREA.png: one bar per row and value column, labelled by the label
columns ("the same" repeats the row above). A value cell is a number, optionally followed
by "x" and a range "(MIN–MAX)", drawn as an error bar; an empty cell draws no bar. Ratios
(all values 0.5-2, a column named "ratio", "... vs ..." or "... / ...") get a line at 1.
--check parses every marked table, draws nothing, and exits 1 naming each table that
cannot be parsed.
"""
import argparse
import os
import pathlib
import re
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parent.parent
MARKER = re.compile(r"^<!--\s*plot:\s*([a-z0-9-]+)\s*\|([^|]*)\|([^|]*?)(?:\|([^|]*?))?\s*-->$")
NUMBER = r"([0-9]*\.?[0-9]+)"
VALUE = re.compile(rf"^{NUMBER}\s*x?\s*(?:\(\s*{NUMBER}\s*[–-]\s*{NUMBER}\s*\))?$")


def plain(text):
    return text.replace("**", "").replace("`", "").strip()


def parse_table(lines, i, label_cols, value_cols):
    """Rows (label, [(value, min, max, text) or None per value column]) after line i."""
    i += 1
    while i < len(lines) and not lines[i].strip():
        i += 1
    table = []
    while i < len(lines) and lines[i].lstrip().startswith("|"):
        table.append([plain(c) for c in lines[i].strip().strip("|").split("|")])
        i += 1
    if len(table) < 3 or not all(set(c) <= set("-: ") for c in table[1]):
        raise ValueError("no Markdown table (header, separator, rows) right after the marker")
    header = table[0]
    for col in label_cols + value_cols:
        if col not in header:
            raise ValueError(f"no column {col!r} (the header has {header})")
    rows, previous = [], []
    for n, row in enumerate(table[2:], start=1):
        if len(row) != len(header):
            raise ValueError(f"row {n} has {len(row)} cells, the header {len(header)}")
        label = [row[header.index(c)] for c in label_cols]
        label = [p if t == "the same" and previous else t for t, p in zip(label, previous or label)]
        previous, values = label, []
        for col in value_cols:
            text = row[header.index(col)]
            m = VALUE.match(text)
            if text and not m:
                raise ValueError(f"row {n}, column {col!r}: {text!r} is not a number")
            v = float(m.group(1)) if m else None
            lo, hi = (float(m.group(2)), float(m.group(3))) if m and m.group(2) else (v, v)
            values.append((v, lo, hi, m.group(1)) if m else None)
        rows.append((label, values))
    if not any(v for _, values in rows for v in values):
        raise ValueError("no values in the value columns")
    return rows


def find_tables(text):
    """[(area, section heading, y axis, label columns, value columns, rows or error)]."""
    lines, heading, found = text.splitlines(), "", []
    for i, line in enumerate(lines):
        if line.startswith("## "):
            heading = plain(line[3:])
        if not (line.lstrip().startswith("<!--") and "plot:" in line):
            continue
        m = MARKER.match(line.strip())
        if not m:
            found.append((f"line {i + 1}", heading, "", [], [], ValueError("malformed marker")))
            continue
        labels, values = ([c.strip() for c in g.split(";") if c.strip()] for g in m.group(2, 3))
        try:
            result = parse_table(lines, i, labels, values)
        except ValueError as e:
            result = e
        if any(m.group(1) == f[0] for f in found):
            result = ValueError("a second table of this area")
        found.append((m.group(1), heading, (m.group(4) or "").strip(), labels, values, result))
    return found


def draw(path, heading, yname, label_cols, value_cols, rows):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    every = [x for _, values in rows for v in values if v for x in v[:3]]
    ratio = all(0.5 <= x <= 2 for x in every) and any(
        w in c for c in value_cols for w in ("ratio", " vs ", " / "))
    width = 0.8 / len(value_cols)
    fig, ax = plt.subplots(figsize=(max(7, 1.2 * len(rows) + 2), 4.8), dpi=110)
    for k, col in enumerate(value_cols):
        bars = [(j + (k - (len(value_cols) - 1) / 2) * width, v[k])
                for j, (_, v) in enumerate(rows) if v[k]]
        xs = [x for x, _ in bars]
        hs = [v for _, (v, _, _, _) in bars]
        errs = [[v - lo for _, (v, lo, _, _) in bars], [hi - v for _, (v, _, hi, _) in bars]]
        ax.bar(xs, hs, width * 0.9, label=col, color=f"C{k}", capsize=3,
               yerr=errs if any(errs[0] + errs[1]) else None, error_kw={"elinewidth": 1})
        for (x, (v, _, hi, text)) in bars:  # above the bar or its error bar
            ax.annotate(text, (x, hi), xytext=(0, 2), textcoords="offset points",
                        ha="center", va="bottom", fontsize=8)
    ylabel = textwrap.fill(yname or (value_cols[0] if len(value_cols) == 1 else ""), 40)
    if ratio:
        low, high = min(every + [1.0]), max(every + [1.0])
        pad = max(0.1 * (high - low), 0.01)
        ax.set_ylim(low - pad, high + 2 * pad)
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
        ylabel = (ylabel + "\n" if ylabel else "") + "(axis does not start at 0)"
    else:
        ax.set_ylim(0, max(every) * 1.15)
    ax.set_ylabel(ylabel, fontsize=9)
    if len(value_cols) > 1:
        ax.legend(fontsize=8)
    labels = [", ".join(t for t in label if t) for label, _ in rows]
    slanted = max(len(t) for t in labels) * len(rows) > 90
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, rotation=25 if slanted else 0, fontsize=8,
                       ha="right" if slanted else "center")
    ax.set_xlabel(" / ".join(label_cols), fontsize=9)
    ax.set_title(heading, fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only parse; exit 1 on a bad table")
    parser.add_argument("--doc", default=ROOT / "docs" / "benchmarks.md", type=pathlib.Path)
    parser.add_argument("--out", default=ROOT / "docs" / "img", type=pathlib.Path)
    args = parser.parse_args()

    tables = find_tables(args.doc.read_text(encoding="utf-8"))
    if not tables:
        sys.exit(f"{args.doc}: no '<!-- plot: ... -->' marker")
    failed = 0
    for area, heading, yname, label_cols, value_cols, result in tables:
        if isinstance(result, Exception):
            print(f"{args.doc}: table {area!r} ({heading}): {result}", file=sys.stderr)
            failed += 1
        elif not args.check:
            args.out.mkdir(parents=True, exist_ok=True)
            path = args.out / f"bench-{area}.png"
            draw(path, heading, yname, label_cols, value_cols, result)
            print(os.path.relpath(path))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
