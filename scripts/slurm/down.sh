#!/usr/bin/env bash
# Stop the test Slurm started by up.sh: cancel every job, stop every slurmd, slurmctld
# and munged, then check that none of our daemons, job steps or jobs is left. Idempotent.
# Only processes of this cluster (pid files, environment marker) are ever signalled.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/common.sh"
take_lock

wait_gone() {  # wait_gone SECONDS PID... -> 0 when every pid has exited
    local deadline=$((SECONDS + $1)) pid alive
    shift
    while ((SECONDS < deadline)); do
        alive=0
        for pid in "$@"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        ((alive)) || return 0
        sleep 0.2
    done
    return 1
}

stop_pids() {  # stop_pids WHAT PID...: SIGTERM, then SIGKILL after 10 s
    local what=$1
    shift
    (($#)) || return 0
    kill -TERM "$@" 2>/dev/null || true
    wait_gone 10 "$@" && return 0
    log "$what did not stop on SIGTERM; sending SIGKILL to $*"
    kill -KILL "$@" 2>/dev/null || true
    wait_gone 5 "$@"
}

ctld=$(pid_of slurmctld)
if [[ -n $ctld ]] && scontrol ping >/dev/null 2>&1; then
    active=$(squeue --noheader --states=PENDING,RUNNING,SUSPENDED,COMPLETING,CONFIGURING --format=%i 2>/dev/null || true)
    if [[ -n $active ]]; then
        log "cancelling jobs: $(echo $active)"
        scancel --full $active 2>/dev/null || true
        deadline=$((SECONDS + 30))
        while [[ -n $(squeue --noheader --states=PENDING,RUNNING,SUSPENDED,COMPLETING,CONFIGURING --format=%i 2>/dev/null) ]] \
            && ((SECONDS < deadline)); do
            sleep 0.5
        done
    fi
fi

stop_pids "job steps" $(our_processes slurmstepd)
# All daemons at once: each takes about 2 s to exit and none needs another to shut down.
stop_pids daemons $(slurmd_pids) $(pid_of slurmctld) $(pid_of munged) \
    $(our_processes "${SLURM_TEST_DAEMONS[@]}")

left=$(our_processes slurmstepd "${SLURM_TEST_DAEMONS[@]}")
if [[ -n $left ]]; then
    log "still running after down: $(ps -o pid=,args= -p "$(echo $left | tr ' ' ,)")"
    exit 1
fi
if [[ -L $SLURM_DEFAULT_CONF && $(readlink "$SLURM_DEFAULT_CONF") == "$SLURM_TEST_CONF" ]]; then
    rm -f "$SLURM_DEFAULT_CONF"
fi
rm -f "$SLURM_TEST_DIR"/run/*.pid "$SLURM_TEST_DIR/munge/munge.socket"*
log "down: no slurmctld, slurmd, slurmstepd or munged of $SLURM_TEST_DIR left"
