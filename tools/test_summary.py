#!/usr/bin/env python3
"""Prints one line counting the test cases of the last `bazel test` run.

Reads the JUnit XML that Bazel keeps under bazel-testlogs/ (one test.xml per
test target, one <testcase> per GoogleTest case) and prints
    N passed, N failed, N skipped
A target that crashed before writing XML counts through the XML Bazel writes
for it. Usage: tools/test_summary.py [bazel-testlogs dir]
"""
import os
import sys
import xml.etree.ElementTree as ET


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "bazel-testlogs"
    passed = failed = skipped = 0
    for dirpath, _, files in os.walk(root, followlinks=True):
        if "test.xml" not in files:
            continue
        try:
            tree = ET.parse(os.path.join(dirpath, "test.xml"))
        except ET.ParseError:
            failed += 1
            continue
        for case in tree.iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                failed += 1
            elif case.get("result") == "skipped" or case.find("skipped") is not None:
                skipped += 1
            else:
                passed += 1
    print(f"{passed} passed, {failed} failed, {skipped} skipped")


if __name__ == "__main__":
    main()
