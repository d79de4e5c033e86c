#!/usr/bin/env python3
"""Prints, for each test that did not pass in a ctest log (Testing/Temporary/LastTest.log),
where its output says what went wrong: a python test's failure reports (from unittest's
"FAIL:"/"ERROR:" lines), else the output's last lines.

Why: scripts/test.sh runs ctest with --output-on-failure, so a failing test's output is
printed when it ends, in the middle of a long run; a reader who sees only the run's head
and tail (a CI summary) then misses the traceback. test.sh calls this at the end."""
import re
import sys

LINES = 60


def blocks(text):
    """(name, output lines, passed) for each test in the log."""
    for m in re.finditer(r"^\d+/\d+ Testing: (\S+)\n.*?^Output:\n-+\n(.*?)^<end of output>\n"
                         r".*?^(Test (?!time)[^\n]*)$", text, re.S | re.M):
        yield m.group(1), m.group(2).splitlines(), m.group(3).startswith("Test Passed")


def why(lines):
    """From the first unittest failure report on, else the last lines."""
    for i, line in enumerate(lines):
        if re.match(r"^(FAIL|ERROR): ", line):
            return lines[max(0, i - 1):][:4 * LINES]
    return lines[-LINES:]


def main():
    if len(sys.argv) < 2 or sys.argv[1] == "--help":
        print("usage: scripts/test-tails.py LastTest.log...   (what each failed test said)")
        return 0 if len(sys.argv) > 1 else 2
    for path in sys.argv[1:]:
        try:
            with open(path, errors="replace") as f:
                text = f.read()
        except OSError as e:
            print(f"test-tails: cannot read {path}: {e}")
            continue
        for name, lines, passed in blocks(text):
            if passed:
                continue
            print(f"==== {name} did not pass; what it said ({path}):")
            print("\n".join(why(lines)))
            print(f"==== end of {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
