#!/usr/bin/env bash
# Start a real Docker engine for the Docker backend's tests, offline:
#  1. install Debian's docker.io when dockerd is missing (apt only; no other network);
#  2. start dockerd in the background as root, its data in a temporary folder, no bridge/iptables;
#  3. build the local image `tangram-test:latest` (sh, sleep, true, busy loop) by `docker import`
#     of a tiny root filesystem made from this machine's busybox or its own /bin files.
# Idempotent: a running engine that answers `docker info` is reused. Exits non-zero, saying why,
# when no engine can be started (the Docker tests then skip with that reason).
set -uo pipefail
IMAGE="${TANGRAM_TEST_IMAGE:-tangram-test:latest}"
STATE="${TANGRAM_DOCKERD_STATE:-/tmp/tangram-dockerd}"
log() { echo "dockerd.sh: $*" >&2; }

if [ "$(id -u)" != 0 ]; then log "not root: cannot start dockerd"; exit 1; fi

if ! docker info >/dev/null 2>&1; then
  if ! command -v dockerd >/dev/null 2>&1; then
    log "installing docker.io (apt)"
    export DEBIAN_FRONTEND=noninteractive
    (apt-get update -qq && apt-get install -y -qq docker.io >/dev/null) \
      || { log "apt-get install docker.io failed"; exit 1; }
  fi
  mkdir -p "$STATE"
  DATA="$(mktemp -d "$STATE/data.XXXXXX")"
  # overlay2 when the kernel allows it on this filesystem, vfs otherwise
  for driver in overlay2 vfs; do
    log "starting dockerd (storage driver $driver, data in $DATA)"
    nohup dockerd --data-root "$DATA" --exec-root "$STATE/exec" --pidfile "$STATE/dockerd.pid" \
      --storage-driver "$driver" --iptables=false --ip6tables=false --bridge=none \
      >"$STATE/dockerd-$driver.log" 2>&1 &
    for _ in $(seq 1 60); do
      docker info >/dev/null 2>&1 && break
      kill -0 $! 2>/dev/null || break
      sleep 0.5
    done
    docker info >/dev/null 2>&1 && break
    kill $! 2>/dev/null; sleep 1
    log "dockerd with $driver did not come up: $(tail -n 3 "$STATE/dockerd-$driver.log")"
  done
  docker info >/dev/null 2>&1 || { log "no Docker engine could be started"; exit 1; }
fi
log "engine up: $(docker version --format '{{.Server.Version}}' 2>/dev/null)"

if docker image inspect "$IMAGE" >/dev/null 2>&1; then log "image $IMAGE present"; exit 0; fi

ROOT="$(mktemp -d)"
trap 'rm -rf "$ROOT"' EXIT
mkdir -p "$ROOT/bin" "$ROOT/tmp" "$ROOT/work" "$ROOT/proc" "$ROOT/sys" "$ROOT/dev" "$ROOT/etc"
chmod 1777 "$ROOT/tmp"
BB="$(command -v busybox || true)"
if [ -n "$BB" ] && ! ldd "$BB" >/dev/null 2>&1; then   # a static busybox: one file does it all
  cp "$BB" "$ROOT/bin/busybox"
  for a in sh sleep true false cat echo yes head ls kill ps; do ln -s busybox "$ROOT/bin/$a"; done
else                                                    # this machine's own binaries + their libs
  for b in sh sleep true false cat echo yes head ls kill; do
    src="$(PATH=/usr/bin:/bin type -P "$b" 2>/dev/null || true)"  # the file, not a builtin
    [ -n "$src" ] && [ -f "$src" ] || continue
    cp -L "$src" "$ROOT/bin/$b"
    ldd "$src" 2>/dev/null | grep -o '/[^ ]*' | while read -r lib; do
      mkdir -p "$ROOT$(dirname "$lib")"; cp -Ln "$lib" "$ROOT$lib"
    done
  done
fi
tar -C "$ROOT" -c . | docker import -c 'ENV PATH=/bin' -c 'WORKDIR /work' - "$IMAGE" >/dev/null \
  || { log "docker import failed"; exit 1; }
docker run --rm --network none "$IMAGE" sh -c 'true && sleep 0 && echo image-ok' \
  || { log "image $IMAGE does not run"; exit 1; }
log "image $IMAGE built"
