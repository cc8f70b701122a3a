# Shared settings of the single-node test Slurm; sourced by up.sh and down.sh.
# Every value can be overridden from the environment before calling the scripts.
SLURM_TEST_DIR=${RECIPEVAL_SLURM_DIR:-/tmp/recipeval-slurm}
SLURM_TEST_PARTITION=${RECIPEVAL_SLURM_PARTITION:-gpu}
SLURM_TEST_GPU_TYPE=${RECIPEVAL_SLURM_GPU_TYPE:-mi355x}
SLURM_TEST_GPU_COUNT=${RECIPEVAL_SLURM_GPU_COUNT:-8}
SLURM_TEST_CTLD_PORT=${RECIPEVAL_SLURM_CTLD_PORT:-6817}
SLURM_TEST_SLURMD_PORT=${RECIPEVAL_SLURM_SLURMD_PORT:-6818}
SLURM_TEST_NODE=$(hostname -s)
SLURM_TEST_CONF=$SLURM_TEST_DIR/etc/slurm.conf
# Slurm's compiled-in config path. The Snakemake slurm-jobstep plugin drops every SLURM_*
# variable (SLURM_CONF too) before its srun inside the job, so srun only finds the config here.
SLURM_DEFAULT_CONF=${RECIPEVAL_SLURM_DEFAULT_CONF:-/etc/slurm/slurm.conf}
PATH="$PATH:/usr/sbin:/sbin"
export SLURM_CONF=$SLURM_TEST_CONF

# Daemons this cluster runs; down.sh checks none of them is left.
SLURM_TEST_DAEMONS=(slurmctld slurmd munged)

log() { echo "slurm: $*" >&2; }

# up.sh and down.sh of one cluster never run at the same time (fd 9; closed for the daemons).
take_lock() {
    [[ ${RECIPEVAL_SLURM_LOCK_HELD:-} == "$SLURM_TEST_DIR" ]] && return 0
    exec 9>"$SLURM_TEST_DIR.lock"
    flock -w 300 9 || { log "another up.sh/down.sh holds $SLURM_TEST_DIR.lock"; exit 1; }
    export RECIPEVAL_SLURM_LOCK_HELD=$SLURM_TEST_DIR
}

pid_of() {  # pid_of NAME -> the live pid recorded in our pid file, or nothing
    local file=$SLURM_TEST_DIR/run/$1.pid pid
    [[ -s $file ]] || return 0
    pid=$(<"$file")
    if kill -0 "$pid" 2>/dev/null && [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$1"* ]]; then
        echo "$pid"
    fi
}

# Processes named NAME that belong to this cluster, so another cluster's are never touched:
# daemons carry our marker in their environment; slurmstepd (empty environment) runs in our
# log directory and holds our slurmd log open.
our_processes() {  # our_processes NAME...
    local pid name
    for name in "$@"; do
        for pid in $(pgrep -x "$name" || true); do
            if tr '\0' '\n' 2>/dev/null <"/proc/$pid/environ" \
                | grep -qx "RECIPEVAL_SLURM_DIR=$SLURM_TEST_DIR" \
                || [[ $(readlink "/proc/$pid/cwd" 2>/dev/null) == "$SLURM_TEST_DIR"/* ]] \
                || [[ $(readlink "/proc/$pid/fd/3" 2>/dev/null) == "$SLURM_TEST_DIR"/* ]]; then
                echo "$pid"
            fi
        done
    done
}
