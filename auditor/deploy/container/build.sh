#!/usr/bin/env bash
# Build the gpu-audit container image with no container registry: the base image is made from Debian's
# packages (mmdebstrap, imported with `podman import`), and gpu-audit is installed into it from wheels built
# here, so the image build itself runs without network. Run from anywhere; needs podman, mmdebstrap and a
# Python 3.11 (Debian 12's Python, so the wheels fit the image) with pip.
#
#   deploy/container/build.sh [--tag IMAGE] [--base IMAGE] [--suite SUITE] [--mirror URL]
#
#   --tag IMAGE    the image to build (default localhost/gpu-audit:VERSION, VERSION from auditor/__init__.py)
#   --base IMAGE   build on this image instead of making a Debian base (e.g. docker.io/library/debian:bookworm-slim
#                  where a registry is reachable; python3 is then installed from Debian's packages)
#   --suite SUITE  the Debian suite of the made base (default bookworm: Python 3.11)
#   --mirror URL   the Debian mirror mmdebstrap reads (default: this machine's apt sources)
#
# Environment: GPU_AUDIT_PODMAN_ARGS, extra podman options for `build` and the base import, for machines
# where the default container runtime cannot start (e.g. "--runtime runc" where crun refuses a cgroup
# layout). GPU_AUDIT_BUILD_ULIMITS, --ulimit options for the build's RUN steps where the runtime cannot raise
# resource limits (no CAP_SYS_RESOURCE), e.g. "--ulimit nofile=20000:20000 --ulimit nproc=1000:1000".
set -euo pipefail

# the checkout: the first folder above this script with pyproject.toml (run as deploy/container/build.sh or
# auditor/deploy/container/build.sh: deploy/ is a link to auditor/deploy)
root=$(cd "$(dirname "$0")" && while [ ! -f pyproject.toml ] && [ "$PWD" != / ]; do cd ..; done; pwd)
version=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' "$root/auditor/__init__.py" | head -1)  # its one place
tag="localhost/gpu-audit:$version" base="" suite=bookworm mirror=""
while [ $# -gt 0 ]; do
  case "$1" in
    --tag) tag=$2; shift 2 ;;
    --base) base=$2; shift 2 ;;
    --suite) suite=$2; shift 2 ;;
    --mirror) mirror=$2; shift 2 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "build.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
log() { printf '[build %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
read -r -a podman_args <<< "${GPU_AUDIT_PODMAN_ARGS:-}"
read -r -a ulimits <<< "${GPU_AUDIT_BUILD_ULIMITS:-}"

py=${PYTHON:-python3}
pyver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ -z "$base" ] && [ "$suite" = bookworm ] && [ "$pyver" != 3.11 ]; then
  echo "build.sh: the wheels are built with Python $pyver but Debian $suite's Python is 3.11; set PYTHON" >&2
  exit 2
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
log "wheels of gpu-audit[postgres] and its dependencies (Python $pyver)"
"$py" -m pip wheel --quiet --disable-pip-version-check -w "$work/wheels" "$root[postgres]"
cp "$root/deploy/container/Containerfile" "$work/Containerfile"

if [ -z "$base" ]; then
  base="localhost/gpu-audit-base:$suite"
  log "base image $base from Debian's packages (mmdebstrap $suite)"
  mmdebstrap --quiet --variant=apt --include=python3,python3-venv,passwd,ca-certificates \
    "$suite" "$work/base.tar" ${mirror:+"$mirror"}
  podman "${podman_args[@]}" import --quiet "$work/base.tar" "$base" >/dev/null
  rm -f "$work/base.tar"
fi

log "image $tag on $base (no network during the build)"
podman "${podman_args[@]}" build --quiet --network none "${ulimits[@]}" --build-arg "BASE=$base" \
  -f "$work/Containerfile" -t "$tag" "$work" >/dev/null
log "built $tag"
