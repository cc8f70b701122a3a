#!/usr/bin/env bash
# Install the Debian packages a single-node test Slurm needs (munge, slurmctld, slurmd, clients).
# Idempotent: does nothing when every binary is already there. Needs root (apt-get).
set -euo pipefail

needed=(munged slurmctld slurmd slurmstepd sbatch srun squeue scontrol)
missing=0
for binary in "${needed[@]}"; do
    PATH="$PATH:/usr/sbin:/sbin" command -v "$binary" >/dev/null || missing=1
done
if [[ $missing == 0 ]]; then
    echo "slurm: packages already installed ($(slurmctld -V 2>/dev/null || true))" >&2
    exit 0
fi

if [[ $(id -u) != 0 ]]; then
    echo "slurm: install.sh needs root for apt-get (run it as root or with sudo)" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends munge slurmctld slurmd slurm-client
echo "slurm: installed $(/usr/sbin/slurmctld -V)" >&2
