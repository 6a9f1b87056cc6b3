#!/usr/bin/env bash
# Make an unprivileged user that can run Tangram's sandboxes without root (run as root; idempotent):
#   - the user (default `tangram-rootless`, or $1) with a subordinate uid and gid range of its own
#     in /etc/subuid and /etc/subgid (newuidmap/newgidmap from Debian's `uidmap` map them);
#   - a cgroup subtree delegated to it: on cgroup v1 a `tangram-user-<name>` folder in each of the
#     cpu, cpuacct, cpuset, memory and pids hierarchies, chowned to the user (cpuset.cpus and
#     cpuset.mems copied from the parent first); on cgroup v2 a `tangram-user-<name>` cgroup below
#     the root with cpu, cpuset, memory and pids enabled for its children, its folder and the
#     files that delegation names (cgroup.procs, cgroup.subtree_control, cgroup.threads) chowned.
# Prints the user's name on its last line. See docs/rootless.md.
set -euo pipefail
user="${1:-tangram-rootless}"
count=65536
if [ "$(id -u)" != 0 ]; then
  echo "rootless.sh: run as root (it adds a user and delegates cgroups)" >&2
  exit 1
fi
if ! command -v newuidmap >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq uidmap >/dev/null \
    || echo "rootless.sh: could not install uidmap (newuidmap/newgidmap)" >&2
fi
id -u "$user" >/dev/null 2>&1 || useradd --create-home --shell /bin/bash "$user"

# a subordinate range: the user's own line, else the first free range above every other one
for file in /etc/subuid /etc/subgid; do
  touch "$file"
  if ! grep -q "^$user:" "$file"; then
    start=$(awk -F: 'BEGIN{m=100000} {e=$2+$3; if (e>m) m=e} END{print m}' "$file")
    echo "$user:$start:$count" >>"$file"
  fi
done

name="tangram-user-$user"
if [ -f /sys/fs/cgroup/cgroup.controllers ] && ! awk '$3 == "cgroup" { found = 1 } END { exit !found }' /proc/self/mounts; then
  top=/sys/fs/cgroup/$name  # cgroup v2
  mkdir -p "$top"
  for c in cpu cpuset memory pids; do
    echo "+$c" >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
    echo "+$c" >"$top/cgroup.subtree_control" 2>/dev/null || true
  done
  chown "$user:" "$top" "$top/cgroup.procs" "$top/cgroup.subtree_control" "$top/cgroup.threads"
  # v2 moves a process only between cgroups whose common ancestor the mover may write: the
  # user's server runs in this leaf (as root: echo PID > $top/server/cgroup.procs, then drop),
  # Tangram's cgroups go beside it (TANGRAM_CGROUP_PARENT=$top)
  mkdir -p "$top/server"
  chown "$user:" "$top/server" "$top/server/cgroup.procs" "$top/server/cgroup.threads"
else
  for c in cpu cpuacct cpuset memory pids; do
    mount=$(awk -v c="$c" '$3 == "cgroup" { n = split($4, o, ","); for (i = 1; i <= n; i++)
              if (o[i] == c) { print $2; exit } }' /proc/self/mounts)
    [ -n "$mount" ] || { echo "rootless.sh: no cgroup v1 $c hierarchy" >&2; continue; }
    mkdir -p "$mount/$name"
    if [ "$c" = cpuset ]; then
      cat "$mount/cpuset.cpus" >"$mount/$name/cpuset.cpus"
      cat "$mount/cpuset.mems" >"$mount/$name/cpuset.mems"
    fi
    chown -R "$user:" "$mount/$name"
  done
fi
# the user's runtime folder (its uid locks live there) where no login made one
uid=$(id -u "$user")
install -d -m 0700 -o "$user" -g "$(id -g "$user")" "/run/user/$uid"
echo "$user"
