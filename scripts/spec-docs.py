#!/usr/bin/env python3
"""Keeps the key tables of docs/job-spec.md equal to what the job-spec schema declares.

    scripts/spec-docs.py PROGRAM DOC          rewrite DOC's tables from `PROGRAM --spec-keys`
    scripts/spec-docs.py --check PROGRAM DOC  exit 1 (with a diff) when they differ

Each table sits between a "<!-- keys: PART -->" line and an "<!-- end keys -->" line.
"""
import argparse
import difflib
import re
import subprocess
import sys

BLOCK = re.compile(r"^<!-- keys: (\S+) -->\n.*?^<!-- end keys -->\n", re.M | re.S)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 on a difference")
    parser.add_argument("program", help="the vflow-train program")
    parser.add_argument("doc", help="the markdown file holding the tables")
    args = parser.parse_args()

    generated = subprocess.run([args.program, "--spec-keys"], check=True, capture_output=True,
                               text=True).stdout
    tables = {m.group(1): m.group(0) for m in BLOCK.finditer(generated)}
    if not tables:
        sys.exit(f"{args.program} --spec-keys printed no tables")
    with open(args.doc, encoding="utf-8") as f:
        text = f.read()
    found = {m.group(1) for m in BLOCK.finditer(text)}
    missing = sorted(set(tables) - found)
    if missing:
        sys.exit(f"{args.doc}: no '<!-- keys: {missing[0]} -->' ... '<!-- end keys -->' block")
    updated = BLOCK.sub(lambda m: tables.get(m.group(1), m.group(0)), text)
    if updated == text:
        return 0
    if args.check:
        sys.stdout.writelines(difflib.unified_diff(text.splitlines(True), updated.splitlines(True),
                                                   args.doc, "generated from the schema"))
        print(f"\n{args.doc}: the key tables differ from the schema; run "
              f"scripts/spec-docs.py {args.program} {args.doc}", file=sys.stderr)
        return 1
    with open(args.doc, "w", encoding="utf-8") as f:
        f.write(updated)
    print(f"{args.doc}: key tables rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
