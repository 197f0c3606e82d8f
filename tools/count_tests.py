#!/usr/bin/env python3
"""Counts gtest test cases from Bazel's test.xml files.

Prints one line "N passed, N failed, N skipped" (", N skipped" only when
non-zero) summed over the given bazel-testlogs directories. A test binary
that crashed before writing its XML leaves Bazel's own synthesized XML,
which counts as one failure. gtest's DISABLED_ bodies (result="suppressed")
are helpers other tests run in a child process, not tests, and are not
counted. Exits 1 when anything failed or nothing ran.
"""
import pathlib
import sys
import xml.etree.ElementTree as ET

passed = failed = skipped = 0
for root in sys.argv[1:]:
    for xml in pathlib.Path(root).rglob("test.xml"):
        try:
            tree = ET.parse(xml)
        except ET.ParseError:
            failed += 1
            print(f"unreadable test result: {xml}", file=sys.stderr)
            continue
        for case in tree.iter("testcase"):
            if case.get("result") == "suppressed":
                continue
            if case.find("failure") is not None or case.find("error") is not None:
                failed += 1
            elif case.get("result") == "skipped" or case.find("skipped") is not None:
                skipped += 1
            else:
                passed += 1
line = f"{passed} passed, {failed} failed"
if skipped:
    line += f", {skipped} skipped"
print(line)
sys.exit(1 if failed or passed + skipped == 0 else 0)
