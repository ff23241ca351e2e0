#!/usr/bin/env bash
# Turn the training image into a squashfs file that pyxis runs with --container-image=/path.sqsh.
#
#   enroot/import.sh [--tag TAG] [--output /fsx/apps/nemo-sd.sqsh] [--build] [--force]
#
#   --tag TAG      Docker image in the local Docker daemon (default: nemo-sd:latest)
#   --output PATH  absolute path of the .sqsh to write (default: /fsx/apps/nemo-sd.sqsh)
#   --build        first run `docker build -t TAG <repo root>` with this repo's Dockerfile
#   --force        replace an existing output file
#
# Environment: ENROOT_SQUASH_OPTIONS (default: -comp zstd -Xcompression-level 3 -b 1M, pyxis' advice
# for images read from a shared filesystem), ENROOT_CACHE_PATH (default: $SHARED_DIR/enroot/cache
# when SHARED_DIR, default /fsx, is a writable directory; enroot's own default otherwise).
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TAG="nemo-sd:latest"
OUTPUT="/fsx/apps/nemo-sd.sqsh"
BUILD=0
FORCE=0
TMP_OUTPUT=""

die() {
  echo "error: $*" >&2
  exit 1
}

usage() {
  sed -n '3,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

parse_args() {
  while [ "$#" -gt 0 ]; do
    case "$1" in
      --tag) [ "$#" -ge 2 ] || die "--tag needs a value"; TAG="$2"; shift 2 ;;
      --tag=*) TAG="${1#--tag=}"; shift ;;
      --output) [ "$#" -ge 2 ] || die "--output needs a value"; OUTPUT="$2"; shift 2 ;;
      --output=*) OUTPUT="${1#--output=}"; shift ;;
      --build) BUILD=1; shift ;;
      --force) FORCE=1; shift ;;
      -h | --help) usage; exit 0 ;;
      *) die "unknown argument '$1' (allowed: --tag TAG, --output PATH, --build, --force, --help)" ;;
    esac
  done
}

check_args() {
  [ -n "$TAG" ] || die "--tag must not be empty"
  case "$TAG" in *[[:space:]]*) die "--tag must not contain whitespace (got '$TAG')" ;; esac
  case "$OUTPUT" in
    /*) ;;
    *) die "--output must be an absolute path (got '$OUTPUT'): pyxis reads a --container-image" \
      "value that does not start with '/' as a registry image name" ;;
  esac
  case "$OUTPUT" in */) die "--output must name a file, not a directory (got '$OUTPUT')" ;; esac
  local dir
  dir="$(dirname "$OUTPUT")"
  # A missing directory usually means the shared filesystem is not mounted: writing there would fill
  # the local root volume instead.
  [ -d "$dir" ] || die "directory '$dir' of --output does not exist (is the shared filesystem mounted?)"
  [ -w "$dir" ] || die "directory '$dir' of --output is not writable"
  if [ -e "$OUTPUT" ] && [ "$FORCE" -ne 1 ]; then
    die "'$OUTPUT' exists; pass --force to replace it"
  fi
  command -v enroot > /dev/null || die "enroot is not installed (it comes with pyxis on the cluster)"
  if [ "$BUILD" -eq 1 ]; then
    command -v docker > /dev/null || die "--build needs docker, which is not installed"
  fi
}

configure_enroot() {
  export ENROOT_SQUASH_OPTIONS="${ENROOT_SQUASH_OPTIONS:--comp zstd -Xcompression-level 3 -b 1M}"
  local shared="${SHARED_DIR:-/fsx}"
  if [ -z "${ENROOT_CACHE_PATH:-}" ] && [ -d "$shared" ] && [ -w "$shared" ]; then
    # Layers are large and the root volume small: cache them on the shared filesystem.
    export ENROOT_CACHE_PATH="$shared/enroot/cache"
    mkdir -p "$ENROOT_CACHE_PATH"
  fi
}

cleanup() {
  if [ -n "$TMP_OUTPUT" ]; then
    rm -f -- "$TMP_OUTPUT"
  fi
}

# The file must be a squashfs image: magic "hsqs" at offset 0, and unsquashfs (when installed) must
# read its superblock.
verify_squashfs() {
  local file="$1" magic
  [ -s "$file" ] || die "enroot produced an empty file"
  magic="$(head -c 4 -- "$file")"
  [ "$magic" = "hsqs" ] || die "enroot's output is not a squashfs image (no 'hsqs' magic)"
  if command -v unsquashfs > /dev/null; then
    unsquashfs -s "$file" > /dev/null || die "unsquashfs cannot read enroot's output"
  fi
}

main() {
  parse_args "$@"
  check_args
  configure_enroot
  if [ "$BUILD" -eq 1 ]; then
    echo "building $TAG from $REPO_ROOT/Dockerfile" >&2
    docker build -t "$TAG" "$REPO_ROOT"
  fi
  # Written beside the output and renamed only once verified, so pyxis never sees half a file.
  TMP_OUTPUT="$OUTPUT.tmp.$$"
  trap cleanup EXIT
  rm -f -- "$TMP_OUTPUT"
  echo "importing dockerd://$TAG into $OUTPUT (ENROOT_SQUASH_OPTIONS='$ENROOT_SQUASH_OPTIONS')" >&2
  enroot import -o "$TMP_OUTPUT" "dockerd://$TAG"
  verify_squashfs "$TMP_OUTPUT"
  mv -f -T -- "$TMP_OUTPUT" "$OUTPUT"
  TMP_OUTPUT=""
  echo "wrote $OUTPUT ($(du -h -- "$OUTPUT" | cut -f1)); run it with srun --container-image=$OUTPUT" >&2
}

main "$@"
