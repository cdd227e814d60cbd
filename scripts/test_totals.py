#!/usr/bin/env python3
"""Sums the `test result:` lines of a `cargo test --no-fail-fast` log and
prints one closing line, so a failure in one suite neither hides the others'
results nor scrolls out of sight: the failed tests by name, then
`tests: N passed, N failed, N skipped` (cargo's "ignored").

Before the totals it prints REPORT (the lines the pinned and kernel checks
append through r2vpo_report::golden::report: which kernel paths ran, which
were skipped and why, what each pin was compared with), when given.

Usage: test_totals.py LOG [REPORT]
"""
import re
import sys

RESULT = re.compile(r"^test result: \w+\. (\d+) passed; (\d+) failed; (\d+) ignored;")
FAILED_TEST = re.compile(r"^test (\S+) \.\.\. FAILED$")
FAILED_TARGET = re.compile(r"^\s+`(.+)`$")


def main(path: str, report: str | None = None) -> int:
    passed = failed = ignored = 0
    names, targets, in_targets = [], [], False
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            m = RESULT.match(line)
            if m:
                passed, failed, ignored = (a + int(b) for a, b in zip((passed, failed, ignored), m.groups()))
                continue
            m = FAILED_TEST.match(line)
            if m:
                names.append(m.group(1))
            if re.match(r"^error: \d+ targets? failed:", line):
                in_targets = True
                continue
            if in_targets:
                m = FAILED_TARGET.match(line)
                if m:
                    targets.append(m.group(1))
                else:
                    in_targets = False
    if report:
        try:
            with open(report, encoding="utf-8") as f:
                lines = [l.rstrip("\n") for l in f if l.strip()]
        except FileNotFoundError:
            lines = ["(no check wrote a report: the pinned tests did not run)"]
        print("\nchecks:")
        for l in lines:
            print(f"  {l}")
    if names or targets:
        print("\nfailed:")
        for n in names:
            print(f"  {n}")
        for t in targets:
            print(f"  target: cargo test {t}")
    if passed + failed + ignored == 0:
        print("tests: no test ran (see the build errors above)")
        return 1
    print(f"\ntests: {passed} passed, {failed} failed, {ignored} skipped")
    return 0


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    sys.exit(main(*sys.argv[1:]))
