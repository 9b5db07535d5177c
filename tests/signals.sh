#!/usr/bin/env bash
# The tests marked `signals` (they Ctrl-C, kill or signal a process) as a background job
# runs them (issue 49): SIGINT and SIGQUIT ignored (what a shell does for `cmd &`),
# stdin closed (</dev/null), no controlling terminal (setsid), umask 077. They must pass
# there as they do in the foreground: each child a test signals restores its own defaults
# (tests/support/signals.py), and the session pins its umask (tests/support/runner_env.py).
#   bash tests/signals.sh             # what .ci/run runs after tests/run.sh
#   bash tests/signals.sh -k ctrl_c   # extra arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
exec setsid --wait sh -c 'trap "" INT QUIT; umask 077; exec .venv/bin/python -m pytest -q -m signals "$@"' \
  sh "$@" </dev/null
