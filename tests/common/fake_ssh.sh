#!/bin/sh
# An ssh stand-in for Open MPI's rsh launcher (mpirun --mca plm_rsh_agent THIS): a second "node" on
# this machine. `fake_ssh.sh [ssh options] HOST COMMAND...` runs COMMAND here, in a UTS namespace
# whose host name is HOST (unshare --uts as root, else in a user namespace), so that the daemon it
# starts (orted) and the ranks under it form their own process tree, see HOST as their host name,
# and talk to the other node over TCP. No network setting is changed.
while [ $# -gt 0 ]; do
  case "$1" in
    -*) shift ;;
    *) break ;;
  esac
done
host=$1
shift
if [ "$(id -u)" = 0 ]; then
  set -- unshare --uts sh -c 'hostname "$0" && exec sh -c "$*"' "$host" "$@"
else
  set -- unshare --user --map-root-user --uts sh -c 'hostname "$0" && exec sh -c "$*"' "$host" "$@"
fi
exec "$@"
