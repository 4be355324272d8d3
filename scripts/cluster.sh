#!/usr/bin/env bash
# docker-compose.yml's cluster where Docker is absent but podman is (users with Docker keep
# `docker compose up --build`):
#   scripts/cluster.sh up       install what is missing (as root), build, start, wait until healthy, print URLs
#   scripts/cluster.sh status   each service's state and health, and the URLs
#   scripts/cluster.sh build    install what is missing and build the images only (CI, ahead of `up`)
#   scripts/cluster.sh compose ARGS...   podman-compose on this cluster (its project, ports, token),
#                               e.g. `compose up -d --no-build --scale worker-cpu=2 worker-cpu`
#   scripts/cluster.sh down     remove the containers, network and volumes `up` made (images stay, for
#                               the next `up`; `down --images` removes the project's images as well)
# As root it installs podman, runc and debootstrap (apt) and podman-compose (PyPI, in its own venv)
# when they are missing. podman's settings come from scripts/cluster/containers.conf and a storage
# file of its own (CONTAINERS_CONF, CONTAINERS_STORAGE_CONF): no system file is changed. Where no
# image registry answers, the base images are stood in for from Debian packages
# (scripts/cluster/standins.sh); Grafana has none and is left out then.
# Each published port is the Compose default when free, else a free one (kept until `down`).
# Environment: FARM_CLUSTER_PROJECT (mediafarm), FARM_CLUSTER_STATE (state and image storage),
# FARM_CLUSTER_TIMEOUT (seconds to wait for health, 600), FARM_API_TOKENS (generated if unset),
# FARM_CLUSTER_COMPOSE_FILES (compose files added to docker-compose.yml, colon-separated, from the
# repo root: the cluster tests' tests/cluster/compose.test.yml).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HERE=$REPO/scripts/cluster
cd "$REPO"

if [ "$(id -u)" = 0 ]; then
  STATE=${FARM_CLUSTER_STATE:-/var/lib/mediafarm-cluster}
  RUNROOT=/run/mediafarm-cluster
else
  STATE=${FARM_CLUSTER_STATE:-${XDG_DATA_HOME:-$HOME/.local/share}/mediafarm-cluster}
  RUNROOT=${XDG_RUNTIME_DIR:-/tmp}/mediafarm-cluster
fi
PROJECT=${FARM_CLUSTER_PROJECT:-mediafarm}
ENVFILE=$STATE/$PROJECT.env
COMPOSE_FILE=$REPO/docker-compose.yml
PODMAN_COMPOSE_VERSION=1.6.0
CA=/etc/ssl/certs/ca-certificates.crt

mkdir -p "$STATE"
export CONTAINERS_CONF=$HERE/containers.conf
export CONTAINERS_STORAGE_CONF=$STATE/storage.conf
[ -f "$CONTAINERS_STORAGE_CONF" ] || printf '[storage]\ndriver = "overlay"\ngraphroot = "%s"\nrunroot = "%s"\n' \
  "$STATE/storage" "$RUNROOT" >"$CONTAINERS_STORAGE_CONF"

say() { echo "cluster: $*" >&2; }
die() { say "$*"; exit 1; }

# Installing and building, one at a time in this state folder (CI starts a build beside the venv's
# install; the tests' `up` then waits for it and finds every layer built). Released by build_images.
install_missing() {
  exec 9>"$STATE/build.lock"
  flock 9
  local need=() tool
  for tool in podman runc debootstrap; do command -v "$tool" >/dev/null || need+=("$tool"); done
  if [ ${#need[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || die "missing ${need[*]}: install them (apt-get install ${need[*]}) or run as root"
    say "installing ${need[*]} (apt)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  fi
  if [ ! -x "$STATE/venv/bin/podman-compose" ]; then
    say "installing podman-compose $PODMAN_COMPOSE_VERSION (pip, in $STATE/venv)"
    python3 -m venv "$STATE/venv"
    "$STATE/venv/bin/pip" install -q "podman-compose==$PODMAN_COMPOSE_VERSION"
  fi
}

# Ports, token and project, written once by `up` and read back by every command until `down`.
# Under the build lock, and never a port another project's file holds: two projects brought up at
# once (the lead's and CI's) each find the other's ports free before either has bound them.
write_env() {
  [ -f "$ENVFILE" ] && return 0
  "$STATE/venv/bin/python" - "$ENVFILE" <<'PY'
import os, pathlib, secrets, socket, sys

target = pathlib.Path(sys.argv[1])
taken = {int(v) for f in target.parent.glob("*.env") if f != target
         for k, _, v in (line.partition("=") for line in f.read_text().splitlines())
         if k.endswith("_PORT") and v.isdigit()}

def free(default: int) -> int:
    for port in (default, *[0] * 100):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            if s.getsockname()[1] not in taken:
                taken.add(s.getsockname()[1])
                return s.getsockname()[1]
    sys.exit("no free port found")

ports = {"FARM_REDIS_PORT": 6379, "FARM_S3_PORT": 8333, "FARM_FLOWER_PORT": 5555, "FARM_GATEWAY_PORT": 8000,
         "FARM_PROMETHEUS_PORT": 9090, "FARM_GRAFANA_PORT": 3000}
lines = [f"{k}={os.environ.get(k) or free(v)}" for k, v in ports.items()]
lines.append(f"FARM_API_TOKENS={os.environ.get('FARM_API_TOKENS') or secrets.token_hex(16)}")
with open(sys.argv[1], "w") as f:
    f.write("\n".join(lines) + "\n")
os.chmod(sys.argv[1], 0o600)
PY
}

load_env() {
  [ -f "$ENVFILE" ] || return 1
  set -a
  # shellcheck disable=SC1090
  . "$ENVFILE"
  set +a
}

COMPOSE=("$STATE/venv/bin/podman-compose" --no-ansi -p "$PROJECT" -f "$COMPOSE_FILE")
IFS=: read -r -a EXTRA_FILES <<<"${FARM_CLUSTER_COMPOSE_FILES:-}"
for f in "${EXTRA_FILES[@]}"; do [ -z "$f" ] || COMPOSE+=(-f "$REPO/$f"); done
compose() { "${COMPOSE[@]}" "$@"; }

# "service image build(0/1)" for every service of the default profile, from the compose file itself.
services() {
  "$STATE/venv/bin/python" - "$COMPOSE_FILE" <<'PY'
import sys, yaml
for name, svc in yaml.safe_load(open(sys.argv[1]))["services"].items():
    if not svc.get("profiles"):
        print(name, svc["image"], int("build" in svc))
PY
}

have_image() { podman image exists "$1" || timeout 60 podman pull -q "$1" >/dev/null 2>&1; }

build_images() {
  local name image build built=" "
  # shellcheck source=scripts/cluster/standins.sh
  . "$HERE/standins.sh"
  standins
  while read -r name image build; do
    [ "$build" = 1 ] || continue
    case "$built" in *" $image "*) continue ;; esac
    say "building $image (service $name)"
    # (A build interpolates the whole file: the gateway's required token, unused by a build.)
    FARM_API_TOKENS=${FARM_API_TOKENS:-unused-by-a-build} nice -n 10 "${COMPOSE[@]}" --podman-build-args="-v $CA:$CA:ro" build "$name" >"$STATE/build-$name.log" 2>&1 \
      || { tail -n 30 "$STATE/build-$name.log" >&2; die "building $image failed (log: $STATE/build-$name.log)"; }
    built="$built$image "
  done < <(services)
  # Earlier builds' images that lost their tag to these (each about an image's size).
  podman image prune -f >/dev/null 2>&1 || true
  flock -u 9
}

# The services `up` starts: every one of the default profile whose image is here (Grafana has no
# stand-in where no registry answers).
startable() {
  local name image build
  while read -r name image build; do
    if [ "$build" = 1 ] || have_image "$image"; then echo "$name"; else say "leaving out $name: no image $image and no registry"; fi
  done < <(services)
}

containers() { podman ps -a --filter "label=io.podman.compose.project=$PROJECT" --format '{{.Names}}'; }

# Healthy: its healthcheck passes (run here: podman schedules none without systemd); a container
# without one: running.
healthy() {
  local state
  state=$(podman inspect -f '{{.State.Status}}' "$1" 2>/dev/null) || return 1
  [ "$state" = running ] || return 1
  if [ -n "$(podman inspect -f '{{if .Config.Healthcheck}}{{.Config.Healthcheck.Test}}{{end}}' "$1")" ]; then
    podman healthcheck run "$1" >/dev/null 2>&1
  fi
}

wait_healthy() {
  local deadline=$((SECONDS + ${FARM_CLUSTER_TIMEOUT:-600})) c pending
  while :; do
    pending=()
    for c in $(containers); do healthy "$c" || pending+=("$c"); done
    [ ${#pending[@]} -eq 0 ] && return 0
    if [ $SECONDS -ge $deadline ]; then
      for c in "${pending[@]}"; do say "$c is not healthy; its last log lines:"; podman logs --tail 20 "$c" >&2 || true; done
      die "not healthy after ${FARM_CLUSTER_TIMEOUT:-600} s: ${pending[*]}"
    fi
    sleep 3
  done
}

urls() {
  echo "gateway http://127.0.0.1:$FARM_GATEWAY_PORT"
  echo "broker redis://127.0.0.1:$FARM_REDIS_PORT/0"
  echo "objects http://127.0.0.1:$FARM_S3_PORT"
  echo "flower http://127.0.0.1:$FARM_FLOWER_PORT"
  echo "prometheus http://127.0.0.1:$FARM_PROMETHEUS_PORT"
  if containers | grep -q grafana; then echo "grafana http://127.0.0.1:$FARM_GRAFANA_PORT"; fi
  echo "token $FARM_API_TOKENS"
}

up() {
  install_missing
  write_env
  load_env
  # Bind mounts whose host folders must exist (podman does not create them as Docker does).
  mkdir -p media models
  build_images
  local names
  names=$(startable | tr '\n' ' ')
  say "starting $names"
  # shellcheck disable=SC2086
  compose up -d --no-build $names >"$STATE/up.log" 2>&1 || { tail -n 30 "$STATE/up.log" >&2; die "podman-compose up failed"; }
  wait_healthy
  urls
}

status() {
  load_env || die "no cluster $PROJECT here (scripts/cluster.sh up)"
  local c h
  for c in $(containers); do
    if healthy "$c"; then h=healthy; else h=unhealthy; fi
    echo "$c $(podman inspect -f '{{.State.Status}}' "$c") $h"
  done
  urls
}

down() {
  load_env || true
  export FARM_API_TOKENS=${FARM_API_TOKENS:-unset}
  if [ -x "$STATE/venv/bin/podman-compose" ]; then
    compose down -v >"$STATE/down.log" 2>&1 || { tail -n 20 "$STATE/down.log" >&2; die "podman-compose down failed"; }
  fi
  # What podman-compose left (a container its restart policy brought back mid-stop, say).
  local c v
  for c in $(containers); do podman rm -f -t 0 "$c" >/dev/null 2>&1 || true; done
  podman pod rm -f "pod_$PROJECT" >/dev/null 2>&1 || true
  for v in $(podman volume ls -q --filter "label=io.podman.compose.project=$PROJECT"); do podman volume rm -f "$v" >/dev/null || true; done
  podman network rm -f "${PROJECT}_default" >/dev/null 2>&1 || true
  if [ "${1:-}" = --images ]; then
    local name image build
    while read -r name image build; do
      [ "$build" = 1 ] && podman rmi -f "$image" >/dev/null 2>&1 || true
    done < <(services)
  fi
  rm -f "$ENVFILE"
}

case "${1:-}" in
  up) up ;;
  build) install_missing; build_images ;;
  compose) shift; load_env || die "no cluster $PROJECT here (scripts/cluster.sh up)"; compose "$@" ;;
  down) shift; down "$@" ;;
  status) status ;;
  *) echo "usage: $0 up|down [--images]|status|build|compose ARGS..." >&2; exit 2 ;;
esac
