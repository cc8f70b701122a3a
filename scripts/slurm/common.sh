# Shared settings of the test Slurm; sourced by up.sh and down.sh.
# Every value can be overridden from the environment before calling the scripts.
SLURM_TEST_DIR=${RECIPEVAL_SLURM_DIR:-/tmp/recipeval-slurm}
SLURM_TEST_PARTITION=${RECIPEVAL_SLURM_PARTITION:-gpu}
SLURM_TEST_GPU_TYPE=${RECIPEVAL_SLURM_GPU_TYPE:-mi355x}
SLURM_TEST_GPU_COUNT=${RECIPEVAL_SLURM_GPU_COUNT:-8}
SLURM_TEST_CTLD_PORT=${RECIPEVAL_SLURM_CTLD_PORT:-6817}
SLURM_TEST_SLURMD_PORT=${RECIPEVAL_SLURM_SLURMD_PORT:-6818}
# One node (default): the node is this host, one slurmd. More: Slurm's multiple-slurmd mode,
# nodes n1..nN on this host, each slurmd with its own port (SLURMD_PORT + i - 1), pid and log.
SLURM_TEST_NODE_COUNT=${RECIPEVAL_SLURM_NODES:-1}
[[ $SLURM_TEST_NODE_COUNT =~ ^[1-9][0-9]*$ ]] \
    || { echo "slurm: RECIPEVAL_SLURM_NODES must be a positive integer, not '$SLURM_TEST_NODE_COUNT'" >&2; exit 2; }
SLURM_TEST_HOST=$(hostname -s)
if ((SLURM_TEST_NODE_COUNT == 1)); then
    SLURM_TEST_NODES=("$SLURM_TEST_HOST")
else
    SLURM_TEST_NODES=()
    for ((i = 1; i <= SLURM_TEST_NODE_COUNT; i++)); do SLURM_TEST_NODES+=("n$i"); done
fi
SLURM_TEST_NODE=${SLURM_TEST_NODES[0]}
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

pid_of() {  # pid_of NAME [FILE] -> the live pid recorded in run/FILE.pid (FILE: NAME), or nothing
    local file=$SLURM_TEST_DIR/run/${2:-$1}.pid pid
    [[ -s $file ]] || return 0
    pid=$(<"$file")
    if kill -0 "$pid" 2>/dev/null && [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$1"* ]]; then
        echo "$pid"
    fi
}

slurmd_pid_file() {  # slurmd_pid_file NODE -> the stem of that node's slurmd pid file
    if ((SLURM_TEST_NODE_COUNT == 1)); then echo slurmd; else echo "slurmd-$1"; fi
}

slurmd_pids() {  # the live slurmd of every node of this cluster
    local node
    for node in "${SLURM_TEST_NODES[@]}"; do pid_of slurmd "$(slurmd_pid_file "$node")"; done
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
