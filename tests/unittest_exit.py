"""Runs a Python test module's unittest cases with an exit status ctest can
read: 0 all passed, 1 a failure or error, 77 (SKIP_RETURN_CODE) when any case
was skipped and none failed, so that a skip shows as ctest "Skipped" and
.ci/check-skips judges it, instead of passing as "Passed".

    from unittest_exit import main   # (tests/ is on sys.path)
    if __name__ == "__main__":
        main()
"""
import sys
import unittest

SKIP_RETURN_CODE = 77


def main(argv=None):
    program = unittest.main(argv=argv, exit=False)
    result = program.result
    if not result.wasSuccessful():
        sys.exit(1)
    if result.skipped:
        for case, why in result.skipped:
            print(f"SKIPPED {case.id()}: {why}", file=sys.stderr)
        sys.exit(SKIP_RETURN_CODE)
    sys.exit(0)
