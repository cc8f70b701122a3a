#!/usr/bin/env bash
# Start a test Slurm (munged + slurmctld + one slurmd per node) whose config, state and logs live
# in $RECIPEVAL_SLURM_DIR (default /tmp/recipeval-slurm); wait until every node is idle.
# RECIPEVAL_SLURM_NODES=N (default 1) starts N nodes on this host (multiple-slurmd mode).
# Idempotent: a healthy running cluster is left as it is. On success prints shell exports
# (use: eval "$(scripts/slurm/up.sh)"). Stop it with down.sh.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/common.sh"
export RECIPEVAL_SLURM_DIR=$SLURM_TEST_DIR  # marker in the daemons' environment, see common.sh
take_lock

print_exports() {
    printf 'export SLURM_CONF=%q\n' "$SLURM_CONF"
    printf 'export RECIPEVAL_SLURM_DIR=%q\n' "$SLURM_TEST_DIR"
    printf 'export RECIPEVAL_SLURM_PARTITION=%q\n' "$SLURM_TEST_PARTITION"
    printf 'export RECIPEVAL_SLURM_GPU_TYPE=%q\n' "$SLURM_TEST_GPU_TYPE"
    printf 'export RECIPEVAL_SLURM_NODES=%q\n' "$SLURM_TEST_NODE_COUNT"
}

# Point the default config path at ours when it is free: missing, or a link to a config that is
# gone. Never replace a real config or another live test cluster's link.
link_default_conf() {
    local target
    target=$(readlink "$SLURM_DEFAULT_CONF" 2>/dev/null || true)
    if [[ $target == "$SLURM_TEST_CONF" ]]; then
        return 0
    elif [[ ! -e $SLURM_DEFAULT_CONF ]]; then  # also true for a dangling link
        mkdir -p "$(dirname "$SLURM_DEFAULT_CONF")"
        ln -sfn "$SLURM_TEST_CONF" "$SLURM_DEFAULT_CONF"
    else
        log "warning: $SLURM_DEFAULT_CONF belongs to another cluster; srun inside Snakemake jobs will use that one"
    fi
}

node_list=$(IFS=,; echo "${SLURM_TEST_NODES[*]}")

node_state() {  # the distinct states of our nodes, comma-separated ("idle" when all are idle)
    sinfo --noheader --Node --nodes="$node_list" --format=%T 2>/dev/null | sort -u | paste -sd,
}

if [[ -n $(pid_of slurmctld) && -n $(pid_of munged) ]] \
    && (($(slurmd_pids | wc -l) == SLURM_TEST_NODE_COUNT)) \
    && [[ $(node_state) =~ ^((idle|mixed|allocated)[^,]*,?)+$ ]]; then
    link_default_conf
    log "already up (nodes $node_list $(node_state), partition $SLURM_TEST_PARTITION)"
    print_exports
    exit 0
fi
fail() {  # report, show the daemons' view, stop whatever was started, exit 1
    trap - ERR
    log "$1"
    scontrol show node "$node_list" >&2 2>/dev/null || true
    tail -n 20 "$SLURM_TEST_DIR"/log/*.log >&2 2>/dev/null || true
    "$here/down.sh" >&2 || true
    exit 1
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Anything half-started is stopped first, so every start begins from a clean state.
"$here/down.sh" >&2

trap 'fail "up.sh failed at line $LINENO"' ERR
slurmd_ports=()
for ((i = 0; i < SLURM_TEST_NODE_COUNT; i++)); do slurmd_ports+=($((SLURM_TEST_SLURMD_PORT + i))); done
for port in "$SLURM_TEST_CTLD_PORT" "${slurmd_ports[@]}"; do
    port_in_use "$port" && fail "port $port is in use (another Slurm?): set RECIPEVAL_SLURM_CTLD_PORT / RECIPEVAL_SLURM_SLURMD_PORT"
done
for binary in munged slurmctld slurmd slurmstepd sbatch; do
    command -v "$binary" >/dev/null || { log "$binary not found: run scripts/slurm/install.sh"; exit 1; }
done

umask 022
mkdir -p "$SLURM_TEST_DIR"
chmod 0700 "$SLURM_TEST_DIR"
mkdir -p "$SLURM_TEST_DIR"/{etc,run,log,state,spool,munge,dev}
chmod 0700 "$SLURM_TEST_DIR/munge"
for node in "${SLURM_TEST_NODES[@]}"; do mkdir -p "$SLURM_TEST_DIR/spool/$node"; done

# Placeholder GPU device nodes: gres.conf needs File= or slurmd reports fewer GPUs than
# configured and the node goes INVALID. Character devices like /dev/null where mknod is allowed.
for ((i = 0; i < SLURM_TEST_GPU_COUNT; i++)); do
    file=$SLURM_TEST_DIR/dev/gpu$i
    [[ -e $file ]] || mknod "$file" c 1 3 2>/dev/null || touch "$file"
done

# At least 8 CPUs even on a small CI machine: test jobs are tiny and profiles ask for cpus_per_task.
cpus=${RECIPEVAL_SLURM_CPUS:-$(( $(nproc) > 8 ? $(nproc) : 8 ))}
# Leave room for the OS; jobs that ask for memory must fit under RealMemory.
real_memory_mb=${RECIPEVAL_SLURM_MEMORY_MB:-$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)}
gpu_range="$SLURM_TEST_DIR/dev/gpu[0-$((SLURM_TEST_GPU_COUNT - 1))]"
node_resources="CPUs=$cpus RealMemory=$real_memory_mb Gres=gpu:$SLURM_TEST_GPU_TYPE:$SLURM_TEST_GPU_COUNT State=UNKNOWN"
if ((SLURM_TEST_NODE_COUNT == 1)); then
    slurmd_files="SlurmdPidFile=$SLURM_TEST_DIR/run/slurmd.pid
SlurmdLogFile=$SLURM_TEST_DIR/log/slurmd.log"
    node_lines="NodeName=$SLURM_TEST_NODE NodeAddr=127.0.0.1 $node_resources"
else
    # Multiple-slurmd mode: every node is this host (NodeHostname), told apart by its port; the
    # placeholder GPU files are shared, each node sees all of them.
    slurmd_files="SlurmdPidFile=$SLURM_TEST_DIR/run/slurmd-%n.pid
SlurmdLogFile=$SLURM_TEST_DIR/log/slurmd-%n.log"
    node_lines=$(for ((i = 0; i < SLURM_TEST_NODE_COUNT; i++)); do
        echo "NodeName=${SLURM_TEST_NODES[i]} NodeHostname=$SLURM_TEST_HOST NodeAddr=127.0.0.1 Port=${slurmd_ports[i]} $node_resources"
    done)
fi

# Job processes are tracked by cgroup, as on real clusters, where the container lets slurmd make
# cgroups: a process that leaves its parent (setsid, a killed batch shell) is still killed at the
# time limit or scancel. proctrack/linuxproc follows parent links only and loses such a process.
cgroup_root=/sys/fs/cgroup
if mkdir "$cgroup_root/freezer/recipeval_probe_$$" 2>/dev/null; then
    rmdir "$cgroup_root/freezer/recipeval_probe_$$"
    proctrack=proctrack/cgroup
    proctrack_comment="processes tracked by the cgroup v1 freezer ($cgroup_root/freezer is writable here)"
else
    proctrack=proctrack/linuxproc
    proctrack_comment="no writable cgroup v1 freezer: processes tracked by parentage, a re-parented one escapes"
    log "warning: $cgroup_root/freezer is not writable; job processes are tracked by parentage (proctrack/linuxproc), and one whose parent died survives the job's end"
fi

cat >"$SLURM_TEST_DIR/etc/slurm.conf" <<CONF
# Written by scripts/slurm/up.sh: a test cluster of $SLURM_TEST_NODE_COUNT node(s), no accounting database.
ClusterName=recipeval-ci
SlurmctldHost=$SLURM_TEST_HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$SLURM_TEST_CTLD_PORT
SlurmdPort=$SLURM_TEST_SLURMD_PORT
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SLURM_TEST_DIR/munge/munge.socket
StateSaveLocation=$SLURM_TEST_DIR/state
SlurmdSpoolDir=$SLURM_TEST_DIR/spool/%n
SlurmctldPidFile=$SLURM_TEST_DIR/run/slurmctld.pid
$slurmd_files
SlurmctldLogFile=$SLURM_TEST_DIR/log/slurmctld.log
SlurmctldDebug=info
SlurmdDebug=info
MpiDefault=none
SwitchType=switch/none
# $proctrack_comment
ProctrackType=$proctrack
# CPUs bound by affinity (task/none makes srun warn "lacks support for cpu binding").
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# Node sizes come from this file, not from probing, so CI can ask for more CPUs than it has.
SlurmdParameters=config_overrides
# No accounting: squeue (with MinJobAge) is the only view of finished jobs.
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
# Finished jobs stay visible to squeue for 10 minutes (the Snakemake slurm plugin polls squeue).
MinJobAge=600
# Short round trips: schedule at once, kill quickly at the time limit, no grace.
SchedulerType=sched/backfill
SchedulerParameters=sched_min_interval=0,bf_interval=1,defer_batch=0
KillWait=2
OverTimeLimit=0
InactiveLimit=0
MessageTimeout=10
SlurmdTimeout=60
ReturnToService=2
GresTypes=gpu
$node_lines
PartitionName=$SLURM_TEST_PARTITION Nodes=$node_list Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF

for node in "${SLURM_TEST_NODES[@]}"; do
    echo "NodeName=$node Name=gpu Type=$SLURM_TEST_GPU_TYPE File=$gpu_range"
done >"$SLURM_TEST_DIR/etc/gres.conf"

if [[ $proctrack == proctrack/cgroup ]]; then
    # Tracking only: no limits, so a test job behaves as it would without cgroups.
    cat >"$SLURM_TEST_DIR/etc/cgroup.conf" <<CONF
CgroupPlugin=cgroup/v1
CgroupMountpoint=$cgroup_root
CgroupAutomount=no
ConstrainCores=no
ConstrainRAMSpace=no
ConstrainDevices=no
CONF
else
    rm -f "$SLURM_TEST_DIR/etc/cgroup.conf"
fi

link_default_conf

# munge: a fresh key for this cluster only.
key=$SLURM_TEST_DIR/munge/munge.key
[[ -s $key ]] || { head -c 1024 /dev/urandom >"$key"; chmod 0400 "$key"; }
munged --force \
    --key-file="$key" \
    --socket="$SLURM_TEST_DIR/munge/munge.socket" \
    --pid-file="$SLURM_TEST_DIR/run/munged.pid" \
    --log-file="$SLURM_TEST_DIR/log/munged.log" \
    --seed-file="$SLURM_TEST_DIR/munge/munged.seed" 9>&-

slurmctld -c -f "$SLURM_CONF" 9>&-
if ((SLURM_TEST_NODE_COUNT == 1)); then
    slurmd -f "$SLURM_CONF" 9>&-
else
    for node in "${SLURM_TEST_NODES[@]}"; do slurmd -f "$SLURM_CONF" -N "$node" 9>&-; done
fi

deadline=$((SECONDS + ${RECIPEVAL_SLURM_UP_TIMEOUT:-60}))
until [[ $(node_state) == idle ]]; do
    ((SECONDS < deadline)) \
        || fail "nodes $node_list not idle after ${RECIPEVAL_SLURM_UP_TIMEOUT:-60}s (state: $(node_state))"
    sleep 0.5
done
log "up: nodes $node_list idle, partition $SLURM_TEST_PARTITION, gres gpu:$SLURM_TEST_GPU_TYPE:$SLURM_TEST_GPU_COUNT, SLURM_CONF=$SLURM_CONF"
print_exports
