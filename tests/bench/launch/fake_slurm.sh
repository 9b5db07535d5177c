#!/bin/sh
# Stands for Slurm's client commands (sbatch, squeue, scontrol, sacct) in the fast tests of
# gpudoctor/bench/launch/slurm.py, where no Slurm controller runs (the real one-node
# cluster of tests/lab/slurm.py is a lab test, minutes per run). A shell script: each call
# costs a few milliseconds (the tests make dozens).
#
# Linked under each client's name into a bin/ directory put first on PATH. Call N writes
# $FAKE_SLURM_DIR/calls/N.argv (the client's name and arguments, each ended by a NUL) and,
# for sbatch (the one given a script on stdin), calls/N.stdin; it answers what the test
# left: NAME.K.out (the K-th call of NAME, from 1) or NAME.out on stdout, NAME.err on
# stderr, NAME.rc as its exit code (0 when absent). The answers are real Slurm's output
# (tests/bench/data/slurm/).
d="$FAKE_SLURM_DIR"
name=${0##*/}
n=0
[ -f "$d/count" ] && read -r n < "$d/count"
n=$((n + 1))
echo "$n" > "$d/count"
k=0
[ -f "$d/$name.count" ] && read -r k < "$d/$name.count"
k=$((k + 1))
echo "$k" > "$d/$name.count"
mkdir -p "$d/calls"
printf '%s\0' "$name" "$@" > "$d/calls/$n.argv"
[ "$name" = sbatch ] && cat > "$d/calls/$n.stdin"
if [ -f "$d/$name.$k.out" ]; then
  cat "$d/$name.$k.out"
elif [ -f "$d/$name.out" ]; then
  cat "$d/$name.out"
fi
[ -f "$d/$name.err" ] && cat "$d/$name.err" >&2
rc=0
[ -f "$d/$name.rc" ] && read -r rc < "$d/$name.rc"
exit "$rc"
