#!/usr/bin/env bash
# Install a pinned Azurite into .azurite/ (ignored by git) and start its blob
# service on loopback, idempotently.
#
#   scripts/azurite.sh install          install only
#   scripts/azurite.sh start [--memory] start (persistent data in .azurite/data,
#                                       or in memory with --memory); no-op if up
#   scripts/azurite.sh stop             stop the instance this script started
#   scripts/azurite.sh status           exit 0 if the blob port answers
#
# Port: BLOBDRIVE_AZURITE_PORT (default 10000). In-memory extent storage:
# BLOBDRIVE_AZURITE_MEMORY_MB (Azurite's default is half the machine's memory;
# it answers 409 MemoryExtentStoreAtSizeLimit past it). Flags for the node
# process that runs it (V8's too, which NODE_OPTIONS refuses), split on
# spaces: BLOBDRIVE_AZURITE_NODE_FLAGS (scripts/bench.sh sets one). Minutes
# between Azurite's sweeps of deleted data (ten by default; a sweep answers no
# request until it has listed every extent): BLOBDRIVE_AZURITE_SWEEP_MINUTES
# (scripts/test.sh sets it longer than its run).
set -euo pipefail

AZURITE_VERSION=3.37.0
root=$(cd "$(dirname "$0")/.." && pwd)
dir="$root/.azurite"
port=${BLOBDRIVE_AZURITE_PORT:-10000}
bin="$dir/node_modules/.bin/azurite-blob"

say() { echo "azurite: $*" >&2; }

is_up() {
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null
}

install() {
  if [ -x "$bin" ] && grep -q "\"version\": \"$AZURITE_VERSION\"" "$dir/node_modules/azurite/package.json" 2>/dev/null; then
    return 0
  fi
  command -v npm >/dev/null || { say "npm is required (apt-get install npm)"; exit 1; }
  mkdir -p "$dir"
  say "installing azurite@$AZURITE_VERSION into $dir"
  npm install --prefix "$dir" --no-audit --no-fund --loglevel=error "azurite@$AZURITE_VERSION" >&2
}

start() {
  local memory=0
  [ "${1:-}" = "--memory" ] && memory=1
  if is_up; then
    say "already listening on 127.0.0.1:$port"
    return 0
  fi
  install
  mkdir -p "$dir/data"
  local args=(--blobHost 127.0.0.1 --blobPort "$port" --skipApiVersionCheck --loose --silent)
  if [ "$memory" = 1 ]; then
    args+=(--inMemoryPersistence)
    [ -n "${BLOBDRIVE_AZURITE_MEMORY_MB:-}" ] && args+=(--extentMemoryLimit "$BLOBDRIVE_AZURITE_MEMORY_MB")
  else
    args+=(--location "$dir/data")
  fi
  local node_flags=()
  read -r -a node_flags <<<"${BLOBDRIVE_AZURITE_NODE_FLAGS:-}"
  if [ -n "${BLOBDRIVE_AZURITE_SWEEP_MINUTES:-}" ]; then
    node_flags+=(--require "$root/scripts/azurite-sweep.js")
  fi
  nohup node "${node_flags[@]}" "$(readlink -f "$bin")" "${args[@]}" >"$dir/azurite-$port.log" 2>&1 &
  echo $! >"$dir/azurite-$port.pid"
  for _ in $(seq 1 100); do
    if is_up; then
      say "listening on 127.0.0.1:$port (pid $(cat "$dir/azurite-$port.pid"))"
      return 0
    fi
    sleep 0.1
  done
  say "did not start; see $dir/azurite-$port.log"
  exit 1
}

stop() {
  local pidfile="$dir/azurite-$port.pid"
  if [ -f "$pidfile" ]; then
    local pid
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null || true
    # Azurite closes its port on SIGTERM but its node process can linger.
    for _ in $(seq 1 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$pidfile"
  fi
}

case "${1:-start}" in
  install) install ;;
  start) shift || true; start "$@" ;;
  stop) stop ;;
  status) is_up ;;
  *) say "usage: $0 install|start [--memory]|stop|status"; exit 2 ;;
esac
