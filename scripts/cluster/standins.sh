#!/usr/bin/env bash
# Stand-in base images for scripts/cluster.sh where no image registry answers: a Debian bookworm
# root filesystem (debootstrap, from the mirror apt already uses on this host), imported into
# podman, and small images tagged with the names docker-compose.yml and the Dockerfile use. Each is
# built only when its tag is missing. Sourced by cluster.sh (podman's CONTAINERS_* set there).

standin_mirror() {
  # The first Debian archive named by apt's own sources (deb822 or one-line format), never a
  # mirror written into the repo.
  local uri
  uri=$(grep -hsE '^(URIs:|deb )' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
    | grep -oE '(https?|file):[^ ]*/debian/?' | grep -v security | head -n1 || true)
  echo "${uri:-http://deb.debian.org/debian}"
}

standin_have() { podman image exists "$1"; }

standin_base() {
  local tag=localhost/mediafarm-standin/debian:bookworm
  standin_have "$tag" && return 0
  local root mirror
  mirror=$(standin_mirror)
  root=$(mktemp -d)
  echo "stand-ins: debootstrap bookworm from $mirror" >&2
  nice -n 10 debootstrap --variant=minbase bookworm "$root" "$mirror" >"$root.log" 2>&1 \
    || { tail -n 20 "$root.log" >&2; rm -rf "$root" "$root.log"; return 1; }
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | podman import -q --change 'CMD ["bash"]' - "$tag" >/dev/null
  rm -rf "$root" "$root.log"
}

# standin_build TAG CONTAINERFILE: build TAG from one of this folder's Containerfiles.
standin_build() {
  standin_have "$1" && return 0
  standin_base
  echo "stand-ins: building $1 from Debian packages" >&2
  nice -n 10 podman build -q $STANDIN_BUILD_ARGS -t "$1" -f "$STANDIN_DIR/$2" "$STANDIN_DIR" >/dev/null
}

# standin_needed IMAGE: true when IMAGE is neither here nor pullable.
standin_needed() {
  standin_have "$1" && return 1
  ! timeout 60 podman pull -q "$1" >/dev/null 2>&1
}

# Extra `podman build` arguments for the stand-ins.
STANDIN_BUILD_ARGS=${STANDIN_BUILD_ARGS:-}
STANDIN_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# The images docker-compose.yml and the Dockerfile name, each pulled if a registry answers, else
# stood in for. Grafana has no stand-in: cluster.sh leaves it out when it has no image.
standins() {
  local image file
  while read -r image file; do
    standin_needed "$image" || continue
    if [ "$file" = Containerfile.seaweedfs ] && [ -n "${CA:-}" ] && [ -f "$CA" ]; then
      # pip inside the build: the host's certificates (cluster.sh's CA), read-only. Only here: a
      # build that installs ca-certificates itself (the Python stand-in) cannot have them mounted.
      STANDIN_BUILD_ARGS="$STANDIN_BUILD_ARGS -v $CA:$CA:ro" standin_build "$image" "$file"
    else
      standin_build "$image" "$file"
    fi
  done <<LIST
python:3.11-slim Containerfile.python
redis:7-alpine Containerfile.redis
$(grep -oE 'image: prom/prometheus[^ ]*' "$STANDIN_DIR/../../docker-compose.yml" | cut -d' ' -f2) Containerfile.prometheus
$(grep -oE 'image: chrislusf/seaweedfs[^ ]*' "$STANDIN_DIR/../../docker-compose.yml" | cut -d' ' -f2) Containerfile.seaweedfs
LIST
}
