#!/usr/bin/env bash
# Grade a class on a Slurm cluster: write the class manifest once, grade it as an array of
# SHARDS tasks (grade.sbatch), then merge (merge.sbatch), which starts when every task has ended,
# failed or not (afterany), and refuses a shard set with a gap.
#
#   COURSE=/shared/mha-course SUBMISSIONS=/shared/submissions WORK=/shared/grading SHARDS=8 \
#       examples/slurm/submit.sh [--lesson 01_attention ...] [-- extra sbatch options]
#
# COURSE: this repository, set up (`make setup`) on a file system every node sees; PYTHON: its
# Python (default $COURSE/.venv/bin/python); WORK: where class.json, shard_<i>/ and merged/ go.
# MHA_RESULTS_KEY: the key that signs every stored verdict (default $WORK/results.key, made here,
# mode 0600): one for every task and the merge, which refuses what it cannot verify; keep it outside
# every RESULTS folder, and back it up with the results (without it, they must be graded again).
# Arguments before `--` go to `python -m autograder manifest` (which lessons); after it, to sbatch.
set -euo pipefail
: "${COURSE:?set COURSE to the course repository}" "${SUBMISSIONS:?set SUBMISSIONS}" "${WORK:?set WORK}"
export COURSE SUBMISSIONS WORK SHARDS="${SHARDS:-4}" PYTHON="${PYTHON:-$COURSE/.venv/bin/python}"
export MHA_RESULTS_KEY="${MHA_RESULTS_KEY:-$WORK/results.key}"  # sbatch passes it to every task (--export=ALL)
manifest_args=() sbatch_args=()
while [ $# -gt 0 ]; do
    if [ "$1" = -- ]; then shift; sbatch_args=("$@"); break; fi
    manifest_args+=("$1"); shift
done
here="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$WORK"
# The key, made once here (if missing) rather than by the first task to finish a result.
(cd "$COURSE" && "$PYTHON" -c "from autograder.results import results_key; results_key(create=True)")

# Once, before any task starts: every shard and the merge read this class list, so a folder that
# changes while the jobs run cannot split the class differently on different nodes.
(cd "$COURSE" && "$PYTHON" -m autograder manifest "$SUBMISSIONS" --out "$WORK/class.json" "${manifest_args[@]}")

array=$(sbatch --parsable --array="0-$((SHARDS - 1))" --chdir="$WORK" "${sbatch_args[@]}" "$here/grade.sbatch")
array=${array%%;*}
merge=$(sbatch --parsable --dependency="afterany:$array" --chdir="$WORK" "${sbatch_args[@]}" "$here/merge.sbatch")
merge=${merge%%;*}
echo "array job $array ($SHARDS tasks), merge job $merge: results in $WORK/merged/grades.csv"
