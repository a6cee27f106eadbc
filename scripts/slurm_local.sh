#!/usr/bin/env bash
# A single-node Slurm on this machine, for the cluster tests and for trying gpubench's Slurm paths
# (run as root; Debian's slurm-wlm and munge must be installed).
#
#   scripts/slurm_local.sh start DIR   # config, state and logs in DIR; waits for the node idle
#   export SLURM_CONF=DIR/slurm.conf  # what the Slurm commands read
#   scripts/slurm_local.sh stop DIR    # stops the daemons started in DIR (their pid files)
#
# Everything lives in DIR: its own munge key, socket and daemon, so nothing of the machine's own
# munge or Slurm configuration is used or changed. No accounting daemon: sacct does not answer.
set -euo pipefail

cmd=${1:-}
dir=${2:-}
if [[ -z $cmd || -z $dir || ($cmd != start && $cmd != stop) ]]; then
    echo "usage: $0 start|stop DIR" >&2
    exit 2
fi
dir=$(realpath -m "$dir")

stop() {
    # SIGTERM to both Slurm daemons at once, then to munged, whose socket their shutdown may
    # still use; each is given 5 s, then SIGKILL (one after another: about 6 s; together: 4 s).
    local names name pid alive pids
    for names in "slurmd slurmctld" "munged"; do
        pids=()
        for name in $names; do
            [[ -f $dir/$name.pid ]] || continue
            pid=$(cat "$dir/$name.pid")
            kill "$pid" 2>/dev/null && pids+=("$pid")
            rm -f "$dir/$name.pid"
        done
        for _ in $(seq 50); do
            alive=0
            for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
            ((alive)) || break
            sleep 0.1
        done
        for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
    done
}

if [[ $cmd == stop ]]; then
    stop
    exit 0
fi

for tool in munged slurmctld slurmd sinfo; do
    command -v "$tool" >/dev/null || { echo "$0: $tool not found (apt-get install slurm-wlm munge)" >&2; exit 1; }
done
# Another Slurm on this machine holds the daemons' ports (6817, 6818): this one's node would never
# come up. Say so now rather than after a minute of waiting.
for daemon in slurmctld slurmd; do
    # (live ones: a daemonizing slurmctld can leave a defunct parent behind)
    running=$(ps -C "$daemon" -o pid=,stat= | awk '$2 !~ /^Z/ {print $1; exit}' || true)
    if [[ -n $running ]]; then
        echo "$0: a $daemon is already running here (pid $running: $(ps -o args= -p "$running" 2>/dev/null || true)); stop it first ($0 stop ITS_DIR, or systemctl stop slurmctld slurmd)" >&2
        exit 1
    fi
done
mkdir -p "$dir/state" "$dir/spool" "$dir/munge"
chmod 700 "$dir/munge"
host=$(hostname -s)
# The node's CPUs and memory as slurmd sees them (memory a little below: slurmd drains a node
# that reports less than its configuration).
read -r cpus mem < <(slurmd -C | awk '/NodeName/ {
    for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] } print v["CPUs"], v["RealMemory"] }')
mem=$((mem * 9 / 10))

dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$dir/munge/munge.key"
munged --force --key-file "$dir/munge/munge.key" --socket "$dir/munge/munge.socket" \
    --pid-file "$dir/munged.pid" --log-file "$dir/munged.log" --seed-file "$dir/munge/seed"

cat > "$dir/slurm.conf" <<EOF
ClusterName=gpubench
SlurmctldHost=$host
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
KillWait=5
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
SlurmdParameters=config_overrides
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF=$dir/slurm.conf
slurmctld -c -f "$SLURM_CONF"   # -c: a clean state (no jobs of an earlier start)
slurmd -f "$SLURM_CONF"

for _ in $(seq 300); do
    state=$(sinfo -h -n "$host" -o %T 2>/dev/null || true)
    if [[ $state == idle ]]; then
        echo "Slurm is up: node $host idle; export SLURM_CONF=$SLURM_CONF"
        exit 0
    fi
    sleep 0.2
done
echo "$0: node $host not idle after 60 s (state: ${state:-none}); logs in $dir" >&2
stop
exit 1
