#!/bin/sh
# Checks deploy/systemd/ckpt-scheduler.service with `systemd-analyze verify`
# (Debian package `systemd`; works in a container without a running systemd).
#
#   deploy/systemd/verify-unit.sh [PATH-OF-ckpt-scheduler]
#
# verify wants ExecStart= to name an existing executable, so the unit is
# checked as a copy whose ExecStart points at the given binary (default: the
# one in build/bin). verify exits 0 on unknown keys and unparsable values,
# only printing them, so any line it prints about the unit fails the check.
# Then `systemd-analyze security --offline=true` scores the unit's sandbox,
# which must stay at or below an exposure of 2.0.
# Exit: 0 clean, 1 problems, 77 systemd-analyze missing (ctest: skipped).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
unit="$here/ckpt-scheduler.service"
binary=${1:-$here/../../build/bin/ckpt-scheduler}
if ! command -v systemd-analyze >/dev/null 2>&1; then
  echo "systemd-analyze not found (apt-get install systemd)" >&2
  exit 77
fi
if [ ! -x "$binary" ]; then
  echo "no executable at $binary: build ckpt-scheduler or pass its path" >&2
  exit 1
fi
binary=$(cd "$(dirname "$binary")" && pwd)/$(basename "$binary")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
sed "s|^ExecStart=/usr/local/bin/ckpt-scheduler |ExecStart=$binary |" "$unit" \
  > "$work/ckpt-scheduler.service"
grep -q "^ExecStart=$binary " "$work/ckpt-scheduler.service" || {
  echo "ExecStart= of $unit does not start with /usr/local/bin/ckpt-scheduler" >&2
  exit 1
}
rc=0
out=$(SYSTEMD_LOG_LEVEL=notice systemd-analyze verify "$work/ckpt-scheduler.service" 2>&1) || rc=$?
if [ -n "$out" ] && printf '%s\n' "$out" | grep -q "ckpt-scheduler"; then rc=1; fi
[ -n "$out" ] && printf '%s\n' "$out" | sed "s|$work/|deploy/systemd/|g" >&2
if [ "$rc" -ne 0 ]; then
  echo "systemd-analyze verify: problems in $unit" >&2
  exit 1
fi
echo "systemd-analyze verify: $unit is clean ($(systemd-analyze --version | head -n1))"

# The sandbox, scored offline: the overall exposure (0 = locked down, 10 =
# none) must stay at most MAX_EXPOSURE tenths (README: 1.9 with systemd 252;
# 5.6 before SystemCallFilter=, CapabilityBoundingSet= & co.).
max_exposure=20
score=$(systemd-analyze security --offline=true "$work/ckpt-scheduler.service" 2>&1 | tail -n1)
echo "systemd-analyze security: $score"
if ! systemd-analyze security --offline=true --threshold=$max_exposure \
    "$work/ckpt-scheduler.service" >/dev/null 2>&1; then
  echo "systemd-analyze security: exposure above $max_exposure tenths for $unit" >&2
  exit 1
fi
