#!/usr/bin/env bash
# A real single-node Slurm on this machine, for the slurm tests and for trying slurm/ templates.
#
#   scripts/slurm-local.sh start     write a config, start munged, slurmctld, slurmd; wait for idle
#   scripts/slurm-local.sh stop      stop the three daemons started by `start`
#   scripts/slurm-local.sh status    daemons, sinfo, and the line that points clients at it
#   eval "$(scripts/slurm-local.sh env)"   export SLURM_CONF for sbatch / srun / sinfo
#
# Everything lives under MTPLAB_SLURM_DIR (default /tmp/mtplab-slurm): slurm.conf, a munge key
# and socket of its own, state, spool, logs and pid files; nothing under /etc is read or written,
# so a host that already runs Slurm or munge is left alone. Ports are the first free pair from
# 17817 up. The node is this host with MTPLAB_SLURM_CPUS CPUs (default: the real count, at least
# 4, so that 2-task jobs fit on a laptop; slurmd is told to trust the configured count).
# Needs root (the daemons run as root, jobs run as the submitting user). Daemons are stopped by
# the pids recorded at start, never by name.
set -euo pipefail

dir=${MTPLAB_SLURM_DIR:-/tmp/mtplab-slurm}
conf=$dir/etc/slurm.conf
node=$(hostname -s)

die() { echo "slurm-local.sh: $*" >&2; exit 1; }

need_tools() {
  local t missing=()
  for t in munged slurmctld slurmd sinfo scontrol sbatch srun; do
    command -v "$t" >/dev/null 2>&1 || missing+=("$t")
  done
  ((${#missing[@]} == 0)) || die "not found: ${missing[*]} (scripts/install-deps.sh installs slurm-wlm and munge)"
}

pid_alive() { [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

free_port_pair() {
  local p
  for ((p = 17817; p < 17917; p += 2)); do
    if port_free "$p" && port_free $((p + 1)); then echo "$p"; return; fi
  done
  die "no free port pair in 17817-17916"
}

write_conf() {
  local port cpus
  port=$(free_port_pair)
  cpus=${MTPLAB_SLURM_CPUS:-$(nproc)}
  ((cpus >= 4)) || cpus=${MTPLAB_SLURM_CPUS:-4}
  : >"$dir/etc/plugstack.conf"
  cat >"$conf" <<CONF
# Written by scripts/slurm-local.sh: a one-node test cluster, not for production.
ClusterName=mtplab-local
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
PlugStackConfig=$dir/etc/plugstack.conf
TmpFS=$dir/tmp
# No cgroups: works in containers and on machines without delegated cgroups. Accounting, job
# completion and switch plugins are left at their default, none (the names of the "none"
# plugins changed across Slurm versions, so they are not spelled out).
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# srun picks the MPI plugin per step (--mpi=pmix); a plain srun starts processes without PMI.
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
MailProg=/bin/true
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=30
KillWait=5
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=local Nodes=$node Default=YES MaxTime=INFINITE State=UP
CONF
}

show_logs() {
  local f
  for f in "$dir"/log/*.log; do
    [[ -f $f ]] || continue
    echo "---- last lines of $f" >&2
    tail -n 15 "$f" >&2
  done
}

node_state() { SLURM_CONF=$conf sinfo -h -N -n "$node" -o %T 2>/dev/null | head -n 1; }

start() {
  [[ $(id -u) -eq 0 ]] || die "start needs root (the daemons run as root)"
  need_tools
  if pid_alive "$dir/run/slurmctld.pid"; then
    echo "slurm-local.sh: already running (config $conf)"
    return 0
  fi
  # A fresh cluster every start: no jobs or node states recovered from an earlier one.
  rm -rf "$dir"
  mkdir -p "$dir"/{etc,munge,state,spool,run,log,tmp}
  chmod 0700 "$dir" "$dir/munge"
  chmod 1777 "$dir/tmp"
  head -c 1024 /dev/urandom >"$dir/munge/munge.key"
  chmod 0400 "$dir/munge/munge.key"
  write_conf

  munged --force --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/run/munged.pid" --log-file="$dir/log/munged.log" \
    --seed-file="$dir/munge/munged.seed" || { show_logs; die "munged did not start"; }
  slurmctld -c -f "$conf" || { show_logs; stop_daemons; die "slurmctld did not start"; }
  slurmd -f "$conf" -N "$node" || { show_logs; stop_daemons; die "slurmd did not start"; }

  local i state=""
  for ((i = 0; i < 60; i++)); do
    state=$(node_state)
    [[ $state == idle ]] && break
    sleep 1
  done
  if [[ $state != idle ]]; then
    show_logs
    stop_daemons
    die "node $node not idle after 60 s (state '${state:-none}')"
  fi
  echo "slurm-local.sh: node $node idle (config $conf); clients need: export SLURM_CONF=$conf"
  # Slurm's pmix plugin dlopen()s the unversioned libpmix.so, which only libpmix-dev ships;
  # without it `srun --mpi=list` still lists pmix but every `srun --mpi=pmix` step fails.
  if ! ldconfig -p 2>/dev/null | grep -q 'libpmix\.so '; then
    echo "slurm-local.sh: warning: no libpmix.so, so srun --mpi=pmix will fail (install libpmix-dev)" >&2
  fi
}

# TERM by recorded pid, then KILL whatever is still there after 15 s.
stop_pidfiles() {
  local f pids=() i pid
  for f in "$@"; do
    if pid_alive "$f"; then pids+=("$(cat "$f")"); fi
  done
  ((${#pids[@]})) || return 0
  kill "${pids[@]}" 2>/dev/null || true
  for ((i = 0; i < 75; i++)); do
    kill -0 "${pids[@]}" 2>/dev/null || break
    sleep 0.2
  done
  for pid in "${pids[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
  done
}

# The Slurm daemons together (each takes a second or two to exit), then munged, which they use
# until they are gone.
stop_daemons() {
  stop_pidfiles "$dir/run/slurmd.pid" "$dir/run/slurmctld.pid"
  stop_pidfiles "$dir/run/munged.pid"
}

stop() {
  [[ -d $dir ]] || { echo "slurm-local.sh: nothing to stop in $dir"; return 0; }
  # Job steps outlive slurmd by design: cancel the jobs first so that none is left running.
  if pid_alive "$dir/run/slurmctld.pid" && [[ -n $(SLURM_CONF=$conf squeue -h -o %i 2>/dev/null) ]]; then
    SLURM_CONF=$conf scancel --partition=local 2>/dev/null || true
    local i
    for ((i = 0; i < 50; i++)); do
      [[ -z $(SLURM_CONF=$conf squeue -h -o %i 2>/dev/null) ]] && break
      sleep 0.2
    done
  fi
  stop_daemons
  echo "slurm-local.sh: stopped (state left in $dir)"
}

status() {
  local d rc=0
  for d in munged slurmctld slurmd; do
    if pid_alive "$dir/run/$d.pid"; then
      echo "$d: running (pid $(cat "$dir/run/$d.pid"))"
    else
      echo "$d: not running"
      rc=1
    fi
  done
  if ((rc == 0)); then
    SLURM_CONF=$conf sinfo
    echo "export SLURM_CONF=$conf"
  fi
  return $rc
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  env) echo "export SLURM_CONF=$conf" ;;
  *) echo "usage: $0 start|stop|status|env   (state in \$MTPLAB_SLURM_DIR, now $dir)" >&2; exit 2 ;;
esac
