#!/usr/bin/env bash
# A multi-node Ray cluster on this one machine, for trying rayward's placement (reward nodes, scaling).
#   local_cluster.sh up [--reward-nodes N] [--generator-node] [--base-port P]   head + N reward nodes
#   local_cluster.sh status                                                    address, nodes, resources
#   local_cluster.sh add-node [--num-cpus N] [--resources JSON]                one more worker node; prints its index
#   local_cluster.sh kill-node INDEX                                           SIGKILL a node: its raylet and workers
#   local_cluster.sh drain-node INDEX [DEADLINE_S]                             `ray drain-node` for preemption
#   local_cluster.sh down                                                      stops only this script's nodes
# Each node is `ray start --block` in the background with its own ports (a block of 20000-29999) and temp dir;
# PIDs live in $RAYWARD_CLUSTER_DIR (default /tmp/rayward-cluster-$USER). Never uses `ray stop`, which would
# kill every Ray process on the machine. Token auth stays on (needs ~/.ray/auth_token or RAY_AUTH_TOKEN[_PATH]).
set -euo pipefail

STATE=${RAYWARD_CLUSTER_DIR:-/tmp/rayward-cluster-${USER:-$(id -un)}}
RAY=${RAY:-ray}
export RAY_AUTH_MODE=token RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=0 RAY_USAGE_STATS_ENABLED=0

block_free() {  # block_free <base> <nodes>: every port this cluster would use can be bound now
  python3 - "$1" "$2" <<'PY' 2>/dev/null
import socket, sys
b, n = int(sys.argv[1]), int(sys.argv[2])
for p in [b, b + 1, b + 2, *range(b + 10, b + 10 + 10 * n), *range(b + 100, b + 100 + 100 * n)]:
    s = socket.socket()
    s.bind(("0.0.0.0", p))  # Ray binds most ports on all interfaces
    s.close()
PY
}

start_node() {  # start_node <index> <label> <extra ray start args...>
  local i=$1 label=$2; shift 2
  local p=$((BASE + 10 + i * 10)) w=$((BASE + 100 + i * 100)) log="$STATE/node-$i-$label.log"
  : >"$log"  # truncate now: the background redirect below may run after the first grep
  setsid "$RAY" start --block --node-ip-address 127.0.0.1 --temp-dir "$STATE/tmp" --disable-usage-stats \
    --node-manager-port $p --object-manager-port $((p + 1)) --dashboard-agent-listen-port $((p + 2)) \
    --dashboard-agent-grpc-port $((p + 3)) --runtime-env-agent-port $((p + 4)) --metrics-export-port $((p + 5)) \
    --min-worker-port $w --max-worker-port $((w + 99)) "$@" >"$log" 2>&1 &
  local pid=$!
  for _ in $(seq 120); do  # "Ray runtime started." in its log, or it died (a loaded machine can time out a join)
    grep -q "Ray runtime started" "$log" && { echo "$pid $label" >>"$STATE/pids"; return 0; }
    kill -0 $pid 2>/dev/null || break
    sleep 1
  done
  kill -KILL -- "-$pid" 2>/dev/null || true
  echo "node $i ($label) failed to start, see $log" >&2
  return 1
}

start_retry() { start_node "$@" || { echo "retrying node $1" >&2; start_node "$@"; }; }

up() {
  local reward=2 gen=0
  BASE=""
  while [ $# -gt 0 ]; do
    case $1 in
      --reward-nodes) reward=$2; shift 2 ;;
      --generator-node) gen=1; shift ;;
      --base-port) BASE=$2; shift 2 ;;
      *) echo "unknown option $1" >&2; exit 2 ;;
    esac
  done
  [ -s "$STATE/pids" ] && { echo "already up ($STATE/pids); run '$0 down' first" >&2; exit 1; }
  mkdir -p "$STATE/tmp"
  local nodes=$((1 + reward + gen)) tries=0
  while :; do  # a base port whose whole block is free (other people run clusters here too)
    [ -n "$BASE" ] || BASE=$((20000 + RANDOM % 9000))
    block_free "$BASE" "$nodes" && break
    tries=$((tries + 1)); [ $tries -lt 20 ] || { echo "no free port block found" >&2; exit 1; }
    BASE=""
  done
  echo "$BASE" >"$STATE/base_port"
  start_retry 0 head --head --port "$BASE" --dashboard-host 127.0.0.1 --dashboard-port $((BASE + 1)) \
    --ray-client-server-port $((BASE + 2)) --num-cpus 2
  for i in $(seq 1 "$reward"); do  # one at a time: parallel joins time out on a busy 2-core machine
    start_retry "$i" reward --address "127.0.0.1:$BASE" --num-cpus 2 --resources '{"reward_node": 8}'
  done
  [ $gen = 0 ] || start_retry $((reward + 1)) generator --address "127.0.0.1:$BASE" --num-cpus 2 \
    --resources '{"generator_node": 1}'
  summary
  cat <<EOF

Point rayward at it (token auth on: clients need RAY_AUTH_MODE=token; rayward sets it when it finds the token):
  rayward run configs/demo.yaml cluster.address=127.0.0.1:$BASE \\
      'cluster.reward_worker={num_cpus: 0.25, resources: {reward_node: 1}}' --name demo
  rayward scale demo --reward-workers 6 --address 127.0.0.1:$BASE
EOF
}

summary() {
  BASE=$(cat "$STATE/base_port")
  echo "address:   127.0.0.1:$BASE      (cluster.address=127.0.0.1:$BASE)"
  echo "dashboard: http://127.0.0.1:$((BASE + 1))"
  while read -r pid label; do
    if kill -0 "$pid" 2>/dev/null; then echo "  $label pid $pid: running"; else echo "  $label pid $pid: exited"; fi
  done <"$STATE/pids"
}

status() {
  [ -s "$STATE/pids" ] || { echo "not running ($STATE)"; return 0; }
  summary
  "$RAY" status --address "127.0.0.1:$BASE" 2>/dev/null | sed -n '/Resources/,$p' || true
}

down() {
  [ -s "$STATE/pids" ] || { echo "not running ($STATE)"; return 0; }
  tac "$STATE/pids" | while read -r pid _; do kill -TERM "$pid" 2>/dev/null || true; done
  for _ in $(seq 20); do
    alive=0
    while read -r pid _; do kill -0 "$pid" 2>/dev/null && alive=1; done <"$STATE/pids"
    [ $alive = 0 ] && break
    sleep 0.5
  done
  # Each node is its own process group (setsid): take down whatever of ours is left, and only that.
  while read -r pid _; do kill -KILL -- "-$pid" 2>/dev/null || true; done <"$STATE/pids"
  rm -f "$STATE/pids" "$STATE/base_port"
  echo "stopped (logs in $STATE)"
}

add_node() {  # a node joins the running cluster (an autoscaler bringing a replacement); prints its index
  local cpus=2 res='{}'
  while [ $# -gt 0 ]; do
    case $1 in
      --num-cpus) cpus=$2; shift 2 ;;
      --resources) res=$2; shift 2 ;;
      *) echo "unknown option $1" >&2; exit 2 ;;
    esac
  done
  [ -s "$STATE/pids" ] || { echo "not running ($STATE)" >&2; exit 1; }
  BASE=$(cat "$STATE/base_port")
  local i
  i=$(wc -l <"$STATE/pids")
  start_retry "$i" added --address "127.0.0.1:$BASE" --num-cpus "$cpus" --resources "$res" >&2
  echo "$i"
}

node_pid() {  # node_pid <index>: the node's `ray start` pid (its process group)
  local pid
  pid=$(sed -n "$(($1 + 1))p" "$STATE/pids" | cut -d' ' -f1)
  [ -n "$pid" ] || { echo "no node $1 ($STATE/pids)" >&2; exit 1; }
  echo "$pid"
}

descendants() {  # descendants <pid>: every process under it (Ray workers leave the node's process group)
  local c
  for c in $(ps -o pid= --ppid "$1"); do echo "$c"; descendants "$c"; done
}

kill_node() {  # the machine goes away: every process of the node (raylet, workers, agents) at once
  [ "${1:-0}" != 0 ] || { echo "kill-node: give a worker node's index (0 is the head)" >&2; exit 2; }
  local pid tree
  pid=$(node_pid "$1")
  tree=$(descendants "$pid")
  kill -STOP -- "-$pid" $tree 2>/dev/null || true  # frozen first: nothing of it reacts to the others' death
  kill -KILL -- "-$pid" $tree 2>/dev/null || true
  echo "node $1 (pid $pid) killed"
}

drain_node() {  # what a cloud's preemption notice does through the autoscaler: the node is drained with a deadline
  [ "${1:-0}" != 0 ] || { echo "drain-node: give a worker node's index (0 is the head)" >&2; exit 2; }
  BASE=$(cat "$STATE/base_port")
  local port=$((BASE + 10 + $1 * 10)) deadline=${2:-30} id
  id=$(python3 - "127.0.0.1:$BASE" "$port" <<'PY' 2>/dev/null
import sys
import ray
ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
print(next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeManagerPort"] == int(sys.argv[2])))
PY
)
  [ -n "$id" ] || { echo "drain-node: no live node $1 (port $port)" >&2; exit 1; }
  "$RAY" drain-node --address "127.0.0.1:$BASE" --node-id "$id" --reason DRAIN_NODE_REASON_PREEMPTION \
    --reason-message "local_cluster.sh drain-node" --deadline-remaining-seconds "$deadline"
  echo "node $1 ($id) draining, deadline in ${deadline}s (kill it with: $0 kill-node $1)"
}

case ${1:-} in
  up) shift; up "$@" ;;
  down) down ;;
  status) status ;;
  add-node) shift; add_node "$@" ;;
  kill-node) kill_node "${2:-}" ;;
  drain-node) drain_node "${2:-}" "${3:-30}" ;;
  *) echo "usage: $0 up [--reward-nodes N] [--generator-node] [--base-port P] | status | add-node [--num-cpus N]" \
       "[--resources JSON] | kill-node INDEX | drain-node INDEX [DEADLINE_S] | down" >&2; exit 2 ;;
esac
