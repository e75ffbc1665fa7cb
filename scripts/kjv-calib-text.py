#!/usr/bin/python3
"""Writes the calibration text for the kjv-moe fixture model: whole books
of the King James Bible from Debian's bible-kjv-text package (the `bible`
program of package bible-kjv), one verse per line, no book, chapter or
verse markers (the layout of the fixture's valid.txt).

Only training books (see the fixture's README): none of the 33 held-out
books of valid.txt, so perplexity on valid.txt stays a held-out measure.
Default books: Joshua, Proverbs, Isaiah, Luke, Romans, Hebrews (narrative,
wisdom, prophecy, gospel, epistles: the kinds of text valid.txt holds).

Usage: scripts/kjv-calib-text.py [--books "Joshua,Luke"] > calib.txt
Needs: apt-get install bible-kjv bible-kjv-text (scripts/setup-debian.sh).
"""
import argparse
import re
import subprocess
import sys

# The held-out books of models/kjv-moe/valid.txt (fixture README).
HELD_OUT = {
    "Ruth", "Esther", "Ecclesiastes", "Lamentations", "Hosea", "Joel",
    "Amos", "Obadiah", "Jonah", "Micah", "Nahum", "Habakkuk", "Zephaniah",
    "Haggai", "Zechariah", "Malachi", "Galatians", "Ephesians",
    "Philippians", "Colossians", "1 Thessalonians", "2 Thessalonians",
    "1 Timothy", "2 Timothy", "Titus", "Philemon", "James", "1 Peter",
    "2 Peter", "1 John", "2 John", "3 John", "Jude",
}
DEFAULT = "Joshua,Proverbs,Isaiah,Luke,Romans,Hebrews"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--books", default=DEFAULT,
                    help="comma-separated book names (default: %(default)s)")
    a = ap.parse_args()
    books = [b.strip() for b in a.books.split(",") if b.strip()]
    bad = [b for b in books if b in HELD_OUT]
    if bad:
        sys.exit("kjv-calib-text: %s held out in valid.txt: never "
                 "calibrate on the evaluation text" % ", ".join(bad))
    try:
        out = subprocess.run(
            ["bible", "-l100000", "-m", "8192",
             "Genesis 1:1-Revelation 22:21"],
            check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        sys.exit("kjv-calib-text: cannot run `bible` (%s); install "
                 "bible-kjv and bible-kjv-text" % e)
    head = re.compile(r"^(\S.*) (\d+)$")
    verse = re.compile(r"^\s+\d+ (.*)$")
    book, seen, n = None, set(), 0
    for line in out.split("\n"):
        m = head.match(line)
        if m:
            book = m.group(1)
            seen.add(book)
            continue
        m = verse.match(line)
        if m and book in books:
            sys.stdout.write(m.group(1) + "\n")
            n += 1
    missing = [b for b in books if b not in seen]
    if missing:
        sys.exit("kjv-calib-text: unknown book(s): %s" % ", ".join(missing))
    print("kjv-calib-text: %d verses of %s" % (n, ", ".join(books)),
          file=sys.stderr)


if __name__ == "__main__":
    main()
