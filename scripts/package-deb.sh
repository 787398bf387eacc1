#!/usr/bin/env bash
# Builds the Debian package iofloor_VERSION_ARCH.deb: the binary in
# /usr/bin, the systemd unit, a commented config for /etc/iofloor, the API
# token made at install, /var/lib/iofloor for what must survive a reboot
# (calibrated device models), the docs and examples in
# /usr/share/doc/iofloor.
#
# The config is not a dpkg conffile: the package carries it as
# /usr/share/iofloor/iofloor.toml and the postinst copies it to /etc/iofloor
# only where no config is. A conffile that meets a config made before the
# package (a source install) stops a non-interactive `apt-get install` at
# dpkg's prompt; this way an existing config is always kept, without a
# question, and a purge removes it.
#
#   scripts/package-deb.sh                      # release build, package in target/deb
#   scripts/package-deb.sh --binary PATH --out DIR
#
# --binary packages an iofloor already built (the tests package the one
# they built instead of building a release again). Needs dpkg-deb (every
# Debian has it), objdump for Depends and objcopy to strip (binutils,
# scripts/deps.sh).
#
# Written with dpkg-deb rather than cargo-deb: the package's maintainer
# scripts (token, systemd enablement, purge) are written out here either
# way, and cargo-deb would cost the suite a few minutes of building it.
set -euo pipefail
cd "$(dirname "$0")/.."

binary=""
out=target/deb
while (($#)); do
  case $1 in
    --binary) binary=${2:?--binary needs a path}; shift 2 ;;
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    *) echo "package-deb.sh: unknown argument $1 (--binary PATH, --out DIR)" >&2; exit 2 ;;
  esac
done
if [[ -z $binary ]]; then
  cargo build --release --locked -p iofloor
  binary=target/release/iofloor
fi
[[ -x $binary ]] || { echo "package-deb.sh: $binary is not an executable" >&2; exit 2; }
for tool in dpkg-deb objdump objcopy; do
  command -v "$tool" >/dev/null || { echo "package-deb.sh: needs $tool (scripts/deps.sh installs it)" >&2; exit 1; }
done

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
arch=$(dpkg --print-architecture)
# The newest glibc symbol version the binary uses is the libc6 it needs
# (what dpkg-shlibdeps would find, without dpkg-dev on the machine).
glibc=$(objdump -T "$binary" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -n1)

mkdir -p "$out"
stage=$(mktemp -d "$out/.stage.XXXXXX")
trap 'rm -rf "$stage"' EXIT

install -D -m 0755 "$binary" "$stage/usr/bin/iofloor"
# Debug information stays out of the package (it is 10x the code).
objcopy --strip-debug "$stage/usr/bin/iofloor"
install -D -m 0644 packaging/deb/iofloor.toml "$stage/usr/share/iofloor/iofloor.toml"
# The unit of examples/, pointed at the package's paths.
install -d "$stage/lib/systemd/system"
sed -e 's#/usr/local/bin/iofloor#/usr/bin/iofloor#g' \
  -e 's#/usr/local/share/doc/iofloor#/usr/share/doc/iofloor#g' \
  examples/iofloor.service >"$stage/lib/systemd/system/iofloor.service"
doc="$stage/usr/share/doc/iofloor"
install -D -m 0644 README.md "$doc/README.md"
install -m 0644 docs/*.md docs/api.yaml "$doc/"
install -D -m 0644 examples/grafana-dashboard.json "$doc/examples/grafana-dashboard.json"
install -m 0644 examples/iofloor.toml "$doc/examples/iofloor.toml"
install -D -m 0644 -t "$doc/examples/prometheus" examples/prometheus/*.yml
cat >"$doc/copyright" <<'COPYRIGHT'
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: iofloor

Files: *
Copyright: the iofloor authors
License: Apache-2.0
 On Debian systems the full text of the Apache License 2.0 is in
 /usr/share/common-licenses/Apache-2.0.
COPYRIGHT

install -d "$stage/DEBIAN"
for script in postinst prerm postrm; do
  install -m 0755 "packaging/deb/$script" "$stage/DEBIAN/$script"
done
size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
cat >"$stage/DEBIAN/control" <<CONTROL
Package: iofloor
Version: $version
Architecture: $arch
Maintainer: iofloor developers <iofloor@localhost>
Installed-Size: $size
Depends: libc6 (>= $glibc), libgcc-s1, init-system-helpers
Recommends: fio
Suggests: libvirt0, prometheus
Section: admin
Priority: optional
Description: per-tenant storage I/O floors for hosts that share flash
 iofloor gives every tenant of a shared block device (cgroups, QEMU and
 libvirt VMs, Kubernetes pods) a floor it can count on, in IOPS, bandwidth
 or normalised cost, and hands the capacity nobody uses to whoever wants
 it. It drives cgroup v2 io.max or v1 blk-throttle and QEMU throttle
 groups, learns the device's capacity from what it serves, and shows what
 it does through an HTTP API, Prometheus metrics and a dashboard.
CONTROL

deb="$out/iofloor_${version}_${arch}.deb"
dpkg-deb --root-owner-group --build "$stage" "$deb" >/dev/null
echo "$deb"
