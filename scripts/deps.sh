#!/usr/bin/env bash
# Installs what iofloor's real-device path needs and a fresh machine of this
# kind lacks: fio, qemu-storage-daemon (qemu-system-common); for the
# real-guest tests qemu-system-x86_64, busybox, cpio and binutils plus the
# guest images (scripts/guest-image.sh: a load guest and a cgroup v2 host);
# for the daemon's tests promtool (prometheus) and chromium; for cluster
# mode etcd (server and etcdctl), and protoc with the well-known protobuf
# types, which the etcd client crate needs to build; for the libvirt
# backend's tests libvirtd with its QEMU driver and virsh; podman and runc
# for the container runtime tests; python3 for the test suite's runner.
# Needs root.
set -euo pipefail
missing=()
command -v fio >/dev/null || missing+=(fio)
command -v qemu-storage-daemon >/dev/null || missing+=(qemu-system-common)
command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
[[ -x /bin/busybox ]] || missing+=(busybox-static)
command -v cpio >/dev/null || missing+=(cpio)
# The cgroup v2 guest (iofloor guest): iofloor goes in stripped of its
# debug information.
command -v strip >/dev/null || missing+=(binutils)
# The Debian package's test (scripts/package-deb.sh): its unit verified.
command -v systemd-analyze >/dev/null || missing+=(systemd)
# The daemon's tests: promtool checks /metrics, Chromium drives the dashboard.
command -v promtool >/dev/null || missing+=(prometheus)
command -v chromium >/dev/null || missing+=(chromium)
# The cluster test bed: network namespaces (ip) entered with nsenter.
command -v ip >/dev/null || missing+=(iproute2)
command -v nsenter >/dev/null || missing+=(util-linux)
command -v etcd >/dev/null || missing+=(etcd-server)
command -v etcdctl >/dev/null || missing+=(etcd-client)
command -v protoc >/dev/null || missing+=(protobuf-compiler)
[[ -f /usr/include/google/protobuf/descriptor.proto ]] || missing+=(libprotobuf-dev)
# The libvirt backend (loaded at run time from libvirt.so.0) and its tests.
command -v libvirtd >/dev/null || missing+=(libvirt-daemon-system libvirt-daemon-driver-qemu)
command -v virsh >/dev/null || missing+=(libvirt-clients)
# Containers found through their runtime's API: podman (its Docker-compatible
# service) with runc (crun refuses this machine's hybrid cgroup layout), and
# catatonit, the init of the pause image `podman kube play` builds for a pod.
command -v podman >/dev/null || missing+=(podman)
command -v runc >/dev/null || missing+=(runc)
[[ -x /usr/libexec/podman/catatonit || -x /usr/bin/catatonit ]] || missing+=(catatonit)
# The test suite's runner (scripts/timed-tests.py) and the analysis scripts.
command -v python3 >/dev/null || missing+=(python3)
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "iofloor: need root to install ${missing[*]}" >&2
    exit 1
  fi
  echo "installing ${missing[*]} ..." >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# libvirt's QEMU runs as root on this kind of machine: /dev/kvm exists but is
# root's only (no KVM here), and as its own user libvirt takes KVM for gone
# and probes QEMU again on every lookup (a domain took 72 s to start,
# measured; 0.4 s as root). A test machine's setting, not a production one.
conf=/etc/libvirt/qemu.conf
if [[ -f $conf ]] && ! grep -qE '^\s*user\s*=' "$conf"; then
  printf '\n# Added by iofloor scripts/deps.sh: QEMU as root (no usable KVM here).\nuser = "root"\ngroup = "root"\n' >>"$conf"
fi
"$(dirname "$0")/guest-image.sh"
