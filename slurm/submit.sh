#!/usr/bin/env bash
# Submits an experiment as a Slurm job array, one array task per point, plus a merge job that
# runs when the array is over.
#
#   slurm/submit.sh EXP.yaml [--ranks N] [--parallel P] [--gpus-per-node G] [--time T]
#                   [--out results.h5] [--set key=value ...] [--wait] [--dry-run] [-- sbatch args...]
#
#   --ranks N          ranks (tasks) per point (default 2)
#   --parallel P       at most P array tasks at once (default 4): --array=0-(points-1)%P
#   --gpus-per-node G  GPUs per node for each task (default: none requested)
#   --time T           time limit per point (default 01:00:00)
#   --out FILE         merged results (default: the experiment's output:)
#   --set key=value    passed to mtplab list and run (repeatable)
#   --wait             wait for the merge job to end (sbatch --wait), exit with its status
#   --dry-run          print the sbatch commands, submit nothing
#   -- ARGS            extra sbatch arguments for both jobs (--partition, --account, ...)
#
# Task files go to <out>.tasks/task-<i>.h5 and logs to mtplab-exp_<array job>_<task>.out in the
# submit directory. Environment: MTPLAB_BIN (default build/bin/mtplab), MTPLAB_LAUNCHER.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
die() { echo "submit.sh: $*" >&2; exit 2; }

exp="" ranks=2 parallel=4 gpus=0 time=01:00:00 out="" wait=0 dry=0
sets=() extra=()
while (($#)); do
  case $1 in
    --ranks) ranks=${2:?--ranks needs a value}; shift 2 ;;
    --parallel) parallel=${2:?--parallel needs a value}; shift 2 ;;
    --gpus-per-node) gpus=${2:?--gpus-per-node needs a value}; shift 2 ;;
    --time) time=${2:?--time needs a value}; shift 2 ;;
    --out) out=${2:?--out needs a value}; shift 2 ;;
    --set) sets+=(--set "${2:?--set needs key=value}"); shift 2 ;;
    --wait) wait=1; shift ;;
    --dry-run) dry=1; shift ;;
    --) shift; extra=("$@"); break ;;
    -h | --help) sed -n '2,22p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) [[ -z $exp ]] || die "one experiment file, got $exp and $1"; exp=$1; shift ;;
  esac
done
[[ -n $exp ]] || die "no experiment file (see --help)"
bin=${MTPLAB_BIN:-build/bin/mtplab}
[[ -x $bin ]] || die "$bin is not an executable (set MTPLAB_BIN, or build first)"

# The points, checked for this rank count before anything is queued.
points=$("$bin" list "$exp" --ranks "$ranks" --count "${sets[@]}") || die "mtplab list refused $exp (see above)"
((points > 0)) || die "$exp has no points"
if [[ -z $out ]]; then
  out=$("$bin" list "$exp" --ranks "$ranks" "${sets[@]}" | sed -n '1s/.*; output \(.*\)$/\1/p')
  [[ -n $out && $out != "(not set)" ]] || die "$exp has no output: key; pass --out"
fi
outdir=$out.tasks
mkdir -p "$(dirname "$out")"

array=(sbatch --parsable --array="0-$((points - 1))%$parallel" --ntasks="$ranks" --time="$time")
((gpus > 0)) && array+=(--gpus-per-node="$gpus")
array+=("${extra[@]}" "$here/experiment.sbatch" "$exp" "$outdir" "${sets[@]}")
merge=(sbatch --parsable "${extra[@]}")
((wait)) && merge+=(--wait)

echo "submit.sh: $exp: $points point(s) x $ranks rank(s), at most $parallel at once; merged into $out"
if ((dry)); then
  echo "${array[*]}"
  echo "${merge[*]} --dependency=afterany:<array job> $here/merge.sbatch $out $outdir"
  exit 0
fi
job=$("${array[@]}")
job=${job%%;*}
echo "submit.sh: array job $job"
merge+=(--dependency="afterany:$job" "$here/merge.sbatch" "$out" "$outdir")
if ((wait)); then
  mjob=$("${merge[@]}")
  echo "submit.sh: merge job ${mjob%%;*} finished; results in $out"
else
  mjob=$("${merge[@]}")
  echo "submit.sh: merge job ${mjob%%;*} (after $job)"
fi
