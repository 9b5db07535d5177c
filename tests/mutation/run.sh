#!/usr/bin/env bash
# Mutation testing of the core modules (not part of CI): see docs/testing.md.
#   bash tests/mutation/run.sh                  # every module of tests/mutation/modules.toml
#   bash tests/mutation/run.sh pve.entries      # one module (names from modules.toml)
#   MUTATION_CAP_S=300 bash tests/mutation/run.sh   # a tighter time cap per module
#   bash tests/mutation/run.sh --engine both    # also gpudoctor's own operators (as CI)
#   bash tests/mutation/run.sh --engine own --modules-file tests/mutation/beyond.toml
# It clones the committed HEAD into a fresh folder (uncommitted edits are not mutated), runs
# mutmut there one module at a time under `nice -n 19` with one process and that module's
# fast unit tests only, and prints `NAME: killed N of M (P %)` per module. The virtual
# environment is MUTATION_VENV (default: the checkout's .venv, made with the project
# installed when missing); mutmut is pinned in tests/mutation/requirements.txt.
# MUTATION_KEEP=1 keeps the clone (mutmut browse / show there); its path is printed.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
venv="${MUTATION_VENV:-$repo/.venv}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q -e "$repo" pytest pytest-timeout hypothesis
fi
want="$(grep -E '^mutmut==' "$repo/tests/mutation/requirements.txt")"
have="$("$venv/bin/python" -m pip show mutmut 2>/dev/null | sed -n 's/^Version: /mutmut==/p' || true)"
if [ "$have" != "$want" ]; then
  "$venv/bin/python" -m pip install -q -r "$repo/tests/mutation/requirements.txt"
fi
work="$(mktemp -d /tmp/gpudoctor-mutation.XXXXXX)"
if [ "${MUTATION_KEEP:-}" = 1 ]; then
  echo "tests/mutation/run.sh: clone kept in $work/clone" >&2
else
  trap 'rm -rf "$work"' EXIT
fi
git clone -q "$repo" "$work/clone"
cap=()
[ -n "${MUTATION_CAP_S:-}" ] && cap=(--cap "$MUTATION_CAP_S")
nice -n 19 "$venv/bin/python" "$work/clone/tests/mutation/run.py" --clone "$work/clone" \
  --mutmut "$venv/bin/mutmut" --logs "$work/logs" "${cap[@]}" "$@"
