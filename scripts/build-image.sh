#!/usr/bin/env bash
# Builds the iofloor container image from packaging/container/Containerfile
# with podman (buildah's builder inside it), from this repository alone: the
# binary and the libraries `ldd` names for it are staged on an empty base,
# so nothing is pulled from a registry.
#
#   scripts/build-image.sh                     # release build, image localhost/iofloor:VERSION
#   scripts/build-image.sh --binary PATH [--tag TAG]
#
# --binary puts an iofloor already built in the image (the tests use the one
# they built). Prints the image's tag. Push it to your registry for a
# cluster (podman push), or import it into containerd on a node
# (podman save TAG | ctr -n k8s.io images import -).
set -euo pipefail
cd "$(dirname "$0")/.."

binary=""
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
tag="localhost/iofloor:$version"
while (($#)); do
  case $1 in
    --binary) binary=${2:?--binary needs a path}; shift 2 ;;
    --tag) tag=${2:?--tag needs a name}; shift 2 ;;
    *) echo "build-image.sh: unknown argument $1 (--binary PATH, --tag TAG)" >&2; exit 2 ;;
  esac
done
for tool in podman ldd objcopy; do
  command -v "$tool" >/dev/null || { echo "build-image.sh: needs $tool (scripts/deps.sh installs it)" >&2; exit 1; }
done
if [[ -z $binary ]]; then
  cargo build --release --locked -p iofloor >&2
  binary=target/release/iofloor
fi
[[ -x $binary ]] || { echo "build-image.sh: $binary is not an executable" >&2; exit 2; }

mkdir -p target/image
context=$(mktemp -d target/image/.context.XXXXXX)
trap 'rm -rf "$context"' EXIT
install -D -m 0755 "$binary" "$context/root/usr/bin/iofloor"
objcopy --strip-debug "$context/root/usr/bin/iofloor"
# The dynamic loader and every library, at the paths the binary asks for.
for lib in $(ldd "$binary" | grep -o '/[^ ]*'); do
  install -D -m 0755 "$(readlink -f "$lib")" "$context/root$lib"
done
# Where the DaemonSet mounts the host's cgroups, state and config.
mkdir -p "$context/root/host/sys/fs/cgroup" "$context/root/run/iofloor" \
  "$context/root/etc/iofloor" "$context/root/tmp"
chmod 1777 "$context/root/tmp"
podman build --quiet --tag "$tag" --file packaging/container/Containerfile "$context" >&2
echo "$tag"
