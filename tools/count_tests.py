#!/usr/bin/env python3
"""Counts test cases from Bazel runs, for the last line of the test command.

  count_tests.py --bep RUN.json --out RUN.counts   after each `bazel test`
  count_tests.py --check NAME RC --out X.counts    one check that is not a
                                                   Bazel test (a fuzzing run,
                                                   the clean-machine check):
                                                   exit status RC 0 passed,
                                                   else failed
  count_tests.py --sum A.counts B.counts ...        prints the closing line

A run is read from its Build Event Protocol file (--build_event_json_file),
so only the targets of that invocation count, however the testlogs
directory is shared between configurations. Each test target's gtest XML
gives its cases (passed, failed, skipped; gtest's DISABLED_ bodies, which
other tests run as helpers, are not counted). A target that Bazel reports
as not passed although its XML shows no failure (a crash or leak report
after the XML was written, a timeout) counts as one more failure, and so
does a test target that failed to build. The closing line is
"N passed, N failed" plus ", N skipped" when any were skipped; the exit
status is 1 when anything failed or nothing ran.
"""
import json
import sys
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET


def count_xml(path):
    passed = failed = skipped = 0
    tree = ET.parse(path)
    for case in tree.iter("testcase"):
        if case.get("result") == "suppressed":
            continue
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        elif case.get("result") == "skipped" or case.find("skipped") is not None:
            skipped += 1
        else:
            passed += 1
    return passed, failed, skipped


def count_run(bep_path):
    passed = failed = skipped = 0
    test_targets = set()
    with open(bep_path) as f:
        events = [json.loads(line) for line in f if line.strip()]
    for ev in events:
        ident = ev.get("id", {})
        if "targetConfigured" in ident and ev.get("configured", {}).get("testSize"):
            test_targets.add(ident["targetConfigured"]["label"])
    for ev in events:
        ident = ev.get("id", {})
        if "testResult" in ident:
            result = ev.get("testResult", {})
            status = result.get("status", "NO_STATUS")
            xml = [o["uri"] for o in result.get("testActionOutput", []) if o.get("name") == "test.xml"]
            p = fl = s = 0
            if xml:
                uri = urllib.parse.urlparse(xml[0])
                try:
                    p, fl, s = count_xml(urllib.parse.unquote(uri.path))
                except (OSError, ET.ParseError) as e:
                    print(f"unreadable test result for {ident['testResult']['label']}: {e}",
                          file=sys.stderr)
                    fl = 1
            if status != "PASSED" and fl == 0:
                print(f"{ident['testResult']['label']}: {status}", file=sys.stderr)
                fl = 1
            passed, failed, skipped = passed + p, failed + fl, skipped + s
        elif "targetCompleted" in ident:
            label = ident["targetCompleted"]["label"]
            if label in test_targets and not ev.get("completed", {}).get("success", False):
                print(f"{label}: failed to build", file=sys.stderr)
                failed += 1
    return passed, failed, skipped


def main(argv):
    if len(argv) == 5 and argv[1] == "--bep" and argv[3] == "--out":
        with open(argv[4], "w") as f:
            json.dump(count_run(argv[2]), f)
        return 0
    if len(argv) == 6 and argv[1] == "--check" and argv[4] == "--out":
        ok = argv[3] == "0"
        if not ok:
            print(f"{argv[2]}: failed (exit status {argv[3]})", file=sys.stderr)
        with open(argv[5], "w") as f:
            json.dump([1, 0, 0] if ok else [0, 1, 0], f)
        return 0
    if len(argv) >= 3 and argv[1] == "--sum":
        passed = failed = skipped = 0
        for path in argv[2:]:
            try:
                with open(path) as f:
                    p, fl, s = json.load(f)
            except OSError:
                print(f"missing counts {path}: that run did not finish", file=sys.stderr)
                p, fl, s = 0, 1, 0
            passed, failed, skipped = passed + p, failed + fl, skipped + s
        line = f"{passed} passed, {failed} failed"
        if skipped:
            line += f", {skipped} skipped"
        print(line)
        return 1 if failed or passed + skipped == 0 else 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
