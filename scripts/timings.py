#!/usr/bin/env python3
"""Where a run of scripts/test.sh spent its time, printed at its end.

Reads what the run left in the directory given (target/test-times): steps.tsv (major, step,
seconds, one line per step, in order), core.log (the output of the decisions' crate's tests),
pgrx-MAJOR.log (the output of cargo pgrx test) and
junit-MAJOR.xml (cargo-nextest's report of the cluster tests). Prints each step's time and number
of tests per major with the total of each major and of the run, then the slowest cluster tests.
"""

import re
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

SLOWEST = 12


def minutes(seconds):
    return f"{int(seconds) // 60}m{int(seconds) % 60:02d}s"


def pgrx_tests(log):
    """How many tests a cargo test run ran and how many failed, from its `test result:` lines."""
    if not log.exists():
        return None
    results = re.findall(r"test result: \w+\. (\d+) passed; (\d+) failed",
                         log.read_text(errors="replace"))
    if not results:
        return None
    return (sum(int(passed) + int(failed) for passed, failed in results),
            sum(int(failed) for _, failed in results))


def cluster_tests(report):
    """Each cluster test's (seconds, binary, name, passed) from a JUnit report; none from a report
    that is missing or cut short."""
    try:
        cases = list(ElementTree.parse(report).iter("testcase"))
    except (OSError, ElementTree.ParseError) as error:
        if report.exists():
            print(f"(no cluster test times: {report.name} is unreadable: {error})")
        return []
    tests = []
    for case in cases:
        binary = case.get("classname").split("::")[-1]
        passed = case.find("failure") is None and case.find("error") is None
        tests.append((float(case.get("time")), binary, case.get("name"), passed))
    return tests


def shown(count):
    """A step's count of tests, (ran, failed), as the table shows it."""
    if count is None:
        return ""
    ran, failed = count
    return f"{ran} ({failed} failed)" if failed else str(ran)


def main(directory):
    steps_file = directory / "steps.tsv"
    if not steps_file.exists():
        return
    steps = [line.split("\t") for line in steps_file.read_text().splitlines() if line]
    majors = list(dict.fromkeys(major for major, _, _ in steps))
    print("\n==> Where the time went")
    print(f"{'major':>5}  {'step':<40} {'tests':>14}  {'time':>7}")
    cluster = {major: cluster_tests(directory / f"junit-{major}.xml") for major in majors}
    counts = {
        "decisions and model checker": lambda major: pgrx_tests(directory / "core.log"),
        "unit, property and #[pg_test] tests": lambda major: pgrx_tests(directory / f"pgrx-{major}.log"),
        "cluster tests": lambda major: (
            (len(cluster[major]), sum(not passed for *_, passed in cluster[major]))
            if cluster[major] else None),
    }

    total = 0
    for major in majors:
        major_seconds, major_tests = 0, (0, 0)
        for step_major, step, seconds in steps:
            if step_major != major:
                continue
            count = counts.get(step, lambda _: None)(major)
            major_seconds += int(seconds)
            if count:
                major_tests = (major_tests[0] + count[0], major_tests[1] + count[1])
            print(f"{major:>5}  {step:<40} {shown(count):>14}  {minutes(int(seconds)):>7}")
        print(f"{major:>5}  {'all of ' + major:<40} {shown(major_tests):>14}  {minutes(major_seconds):>7}")
        total += major_seconds
    print(f"{'':>5}  {'the whole run':<40} {'':>14}  {minutes(total):>7}")

    every = [(seconds, major, binary, name, passed)
             for major in majors for seconds, binary, name, passed in cluster[major]]
    if not every:
        return
    print(f"\n==> The {min(SLOWEST, len(every))} slowest cluster tests")
    print(f"{'major':>5}  {'time':>7}  test")
    for seconds, major, binary, name, passed in sorted(every, reverse=True)[:SLOWEST]:
        failed = "" if passed else "  (failed)"
        print(f"{major:>5}  {seconds:>6.1f}s  {binary}::{name}{failed}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
