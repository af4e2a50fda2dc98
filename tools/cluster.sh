#!/usr/bin/env bash
# tools/cluster.sh: a cluster of emulated hosts on this Linux machine, one MPI job across
# them over TCP, and everything removed afterwards.
#
#   sudo tools/cluster.sh --hosts 2 --link 1gbit -- -n 4 ./train_dp --steps 200
#   sudo tools/cluster.sh --hosts 4 -- -n 8 ./train_3d --tp 2 --dp 2 --pp 2
#
# Everything after -- is what you would give mpirun. Ranks fill the hosts in order (ranks
# 0..k-1 on host0, the next k on host1, ...: k = ceil(ranks / hosts)), so the fastest axis
# of train_3d's grid (TP) stays inside a host, as on a real cluster.
#
#                 bridge namespace (br0)
#          veth /      |       \ veth           each host: a network namespace with its own
#       host0        host1 ...  hostN-1         loopback and address 10.99.0.(i+1), its own
#   (mpirun runs here)                          hostname (a UTS namespace), every link shaped
#                                               by tc tbf to --link in both directions
#
# (OpenMPI's launcher may warn that setpgid failed for a command that the agent had already
# started: harmless, and filtered out.)
#
# Within a host, ranks talk through shared memory (OpenMPI's vader); between hosts, TCP over
# the emulated links only. mpirun reaches the other hosts without ssh: its remote shell
# is this script's agent, which runs the command inside that host's namespaces. The kernel
# here has no netem, so a link has a bandwidth but no added delay: its latency is the one of
# the Linux network stack (tools/costmodel.c measures it).
#
# Flags: --hosts N (2 to 8, default 2); --link RATE (tc's units: 100mbit, 1gbit, 10gbit;
# default none: unshaped); --timeout S (default 600: the job is ended after S seconds).
# Needs root, iproute2, util-linux's unshare and OpenMPI; says so and changes nothing if one
# is missing. Cleans up on success, failure, timeout and Ctrl-C: the processes in each
# namespace are killed, then the namespaces (and with them the links) deleted.
set -uo pipefail

# the agent: mpirun calls it as `agent HOST COMMAND...` instead of ssh
if [ "${1:-}" = --agent ]; then
    host=$2
    shift 2
    exec ip netns exec "${CLUSTER_PREFIX}_$host" unshare --uts sh -c "hostname $host && $*"
fi

hosts=2 link=none limit=600 given=" "
die() { echo "tools/cluster.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case $1 in
        --hosts | --link | --timeout) [ $# -ge 2 ] || die "$1 needs a value (usage: tools/cluster.sh [--hosts N] [--link RATE] [--timeout S] -- MPIRUN-ARGS...)"
            # one rule for every program and tool: a flag given twice is refused
            [[ $given == *" $1 "* ]] && die "$1 is given twice: give each flag once"
            given="$given$1 " ;;&
        --hosts) hosts=$2; shift 2 ;;
        --link) link=$2; shift 2 ;;
        --timeout) limit=$2; shift 2 ;;
        --) shift; break ;;
        -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown flag '$1' (usage: tools/cluster.sh [--hosts N] [--link RATE] [--timeout S] -- MPIRUN-ARGS...)" ;;
    esac
done
[ $# -gt 0 ] || die "nothing to run: give mpirun's arguments after --"
# numbers as text first: bash's [ -ge ] fails with its own message on one too large for it
[[ $hosts =~ ^[2-8]$ ]] || die "--hosts must be 2 to 8, got '$hosts'"
[[ $limit =~ ^[1-9][0-9]{0,6}$ ]] || die "--timeout must be a number of seconds from 1 to 9999999, got '$limit'"
[[ $link = none || $link =~ ^[1-9][0-9]{0,5}(kbit|mbit|gbit)$ ]] || die "--link must be none or a rate such as 100mbit, 1gbit, 10gbit; got '$link'"
# what it needs, checked before anything is made
[ "$(id -u)" = 0 ] || die "emulated hosts are network namespaces, which need root (run it with sudo)"
for tool in ip unshare tc; do command -v $tool >/dev/null || die "'$tool' is missing (apt-get install iproute2 util-linux)"; done
launcher=${MPIEXEC:-mpirun}
"$launcher" --version 2>&1 | grep -q 'Open MPI' ||
    die "the emulated cluster launches with OpenMPI's mpirun, and '$launcher' is another MPI ($("$launcher" --version 2>&1 | head -1)); install openmpi-bin"
ranks=""
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    case ${args[i]} in -n | -np | --np) ranks=${args[i + 1]:-} ;; esac
done
[[ $ranks =~ ^[1-9][0-9]{0,5}$ ]] || die "say how many ranks with -n N (1 to 999999) among mpirun's arguments"

# hosts left by a run that was killed outright (SIGKILL: no cleanup could run): removed now
for ns in $(ip netns list 2>/dev/null | grep -oE '^mlpc[0-9]+_[a-z0-9]+'); do
    pid=${ns#mlpc}
    pid=${pid%%_*}
    if ! kill -0 "$pid" 2>/dev/null; then
        ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
        ip netns del "$ns" 2>/dev/null
    fi
done
export CLUSTER_PREFIX="mlpc$$"
P=$CLUSTER_PREFIX
made=()
cleanup() {
    trap - EXIT INT TERM HUP
    local ns
    for ns in "${made[@]}"; do # the processes first: a namespace with processes outlives its deletion
        ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
    done
    for ns in "${made[@]}"; do ip netns del "$ns" 2>/dev/null; done
    rm -rf "$work"
}
work=$(mktemp -d)
trap cleanup EXIT
trap 'echo "tools/cluster.sh: interrupted; removing the hosts" >&2; exit 130' INT TERM HUP
mk() { ip netns add "$1" || die "cannot make network namespace $1 (are namespaces available here?)"; made+=("$1"); }
mk ${P}_br
ip -n ${P}_br link add br0 type bridge && ip -n ${P}_br link set br0 up || die "cannot make the bridge"
shape() { # NAMESPACE DEVICE: tc tbf at the link's rate, 1 ms worth of burst (a larger burst lets whole messages pass unshaped)
    [ "$link" = none ] && return 0
    local num=${link%%[a-z]*} unit=${link##*[0-9]} bps
    case $unit in kbit) bps=$((num * 1000)) ;; mbit) bps=$((num * 1000000)) ;; gbit) bps=$((num * 1000000000)) ;; esac
    local burst=$((bps / 8 / 1000))
    [ $burst -lt 4000 ] && burst=4000
    ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "$link" burst "$burst" latency 100ms ||
        die "tc tbf refused rate $link on $2"
}
for ((h = 0; h < hosts; h++)); do
    mk ${P}_host$h
    ip link add vh$h netns ${P}_host$h type veth peer name vb$h netns ${P}_br || die "cannot make a veth link"
    ip -n ${P}_br link set vb$h master br0 up
    ip -n ${P}_host$h addr add 10.99.0.$((h + 1))/24 dev vh$h
    ip -n ${P}_host$h link set vh$h up
    ip -n ${P}_host$h link set lo up
    # TCP restarts slow start after an idle moment by default: between a step's messages it
    # would never reach the link's rate (an MPI fabric does not behave so)
    ip netns exec ${P}_host$h sysctl -q -w net.ipv4.tcp_slow_start_after_idle=0 2>/dev/null
    shape ${P}_host$h vh$h # what the host sends
    shape ${P}_br vb$h     # what it receives
done

per=$(((ranks + hosts - 1) / hosts))
for ((h = 0; h < hosts; h++)); do echo "host$h slots=$per"; done >"$work/hostfile"
net=10.99.0.0/24
yield=0
[ "$ranks" -gt "$(nproc)" ] && yield=1 # ranks that wait must give the cores to those that compute
# mpirun runs in host0, as it would on a cluster's first node
ip netns exec ${P}_host0 unshare --uts sh -c 'hostname host0 && exec "$@"' sh \
    env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 CLUSTER_PREFIX=$P \
    timeout --kill-after=5 "$limit" "$launcher" --hostfile "$work/hostfile" --mca plm_rsh_agent "$(realpath "$0") --agent" \
    --mca btl self,vader,tcp --mca btl_tcp_if_include $net --mca oob_tcp_if_include $net \
    --mca mpi_yield_when_idle $yield --mca odls_base_sigkill_timeout 0 --bind-to none "$@" 2> >(grep --line-buffered -v 'plm:rsh: Warning: setpgid' >&2) &
job=$!
wait $job
status=$?
[ $status = 124 ] && echo "tools/cluster.sh: the job ran past --timeout $limit s and was ended" >&2
exit $status
