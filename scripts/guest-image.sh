#!/usr/bin/env bash
# Builds the guests of iofloor's real-VM tests from Debian's cloud kernel:
#
# - the load guest: a busybox initramfs that loads the virtio block modules
#   and reads every virtio disk with O_DIRECT forever (QD1, 4 KiB each), so
#   the host sees a guest's I/O through QEMU's virtio-blk path:
#     $IOFLOOR_GUEST_DIR (default /var/cache/iofloor/guest)/{vmlinuz,initramfs.gz,VERSION}
# - the cgroup v2 host (`iofloor guest`, crates/testbed/src/v2guest.rs):
#   cgroup2 mounted with io enabled at its root, fio and every library it
#   links, BFQ, virtio-net for the API and a shell on a virtio-serial port
#   (the host's command channel); iofloor itself comes in a second cpio the
#   host appends at boot:
#     $IOFLOOR_GUEST_DIR/v2/{base.cpio,VERSION} (booting the same vmlinuz)
# Needs root, qemu-system-x86, busybox-static, cpio and fio (scripts/deps.sh
# installs them).
set -euo pipefail
out=${IOFLOOR_GUEST_DIR:-/var/cache/iofloor/guest}
# The images' versions: an older one (the load guest reading only its first
# disk; no v2 host at all) is rebuilt.
version_wanted=2
v2_version_wanted=2
load_ready() {
  [[ -s $out/vmlinuz && -s $out/initramfs.gz && $(cat "$out/VERSION" 2>/dev/null) == "$version_wanted" ]]
}
v2_ready() {
  [[ -s $out/vmlinuz && -s $out/v2/base.cpio && $(cat "$out/v2/VERSION" 2>/dev/null) == "$v2_version_wanted" ]]
}
if load_ready && v2_ready; then
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
pkg=$(apt-cache depends linux-image-cloud-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
if [[ -z $pkg ]]; then
  echo "iofloor: no linux-image-cloud-amd64 in the package index (apt-get update?)" >&2
  exit 1
fi
# apt's sandbox user cannot write to a root-owned mktemp dir; fine as root.
apt-get download -qq "$pkg" 2>/dev/null
dpkg-deb -x ./*.deb kernel
version=${pkg#linux-image-}
modules=kernel/lib/modules/$version/kernel

build_load_image() {
  mkdir -p root/{bin,dev,proc,sys,lib/modules}
  cp /bin/busybox root/bin/busybox
  for m in virtio/virtio_ring virtio/virtio virtio/virtio_pci_modern_dev virtio/virtio_pci_legacy_dev \
    virtio/virtio_pci; do
    cp "$modules/drivers/$m.ko" root/lib/modules/
  done
  cp "$modules/drivers/block/virtio_blk.ko" root/lib/modules/
  cat >root/init <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci virtio_blk; do
  insmod /lib/modules/$m.ko
done
n=0
while [ ! -b /dev/vda ] && [ $n -lt 50 ]; do sleep 0.1; n=$((n + 1)); done
sleep 0.5
for d in /dev/vd?; do
  [ "$d" = /dev/vda ] && continue
  echo "iofloor-guest: load running on $d"
  (while true; do dd if=$d of=/dev/null bs=4096 iflag=direct 2>/dev/null; done) &
done
echo "iofloor-guest: load running on /dev/vda"
while true; do
  dd if=/dev/vda of=/dev/null bs=4096 iflag=direct 2>/dev/null
done
INIT
  chmod +x root/init
  mkdir -p "$out"
  (cd root && find . | cpio -o -H newc --quiet | gzip -1) >"$out/initramfs.gz.tmp"
  cp "kernel/boot/vmlinuz-$version" "$out/vmlinuz.tmp"
  mv "$out/initramfs.gz.tmp" "$out/initramfs.gz"
  mv "$out/vmlinuz.tmp" "$out/vmlinuz"
  echo "$version_wanted" >"$out/VERSION"
  echo "guest image in $out ($version)" >&2
}

build_v2_image() {
  local r=v2root
  mkdir -p $r/{bin,dev,proc,sys,tmp,run,etc,lib/modules,lib64,usr/bin}
  cp /bin/busybox $r/bin/busybox
  for m in drivers/virtio/virtio_ring drivers/virtio/virtio drivers/virtio/virtio_pci_modern_dev \
    drivers/virtio/virtio_pci_legacy_dev drivers/virtio/virtio_pci drivers/block/virtio_blk \
    drivers/char/virtio_console net/core/failover drivers/net/net_failover drivers/net/virtio_net \
    block/bfq; do
    cp "$modules/$m.ko" $r/lib/modules/
  done
  # fio and every library it links, at the paths the loader finds them at.
  if ldd /usr/bin/fio | grep -q "not found"; then
    echo "iofloor: fio links a library that is not installed:" >&2
    ldd /usr/bin/fio | grep "not found" >&2
    exit 1
  fi
  cp /usr/bin/fio $r/usr/bin/fio
  for lib in $(ldd /usr/bin/fio | awk '$2 == "=>" {print $3}'); do
    mkdir -p "$r$(dirname "$lib")"
    cp -L "$lib" "$r$lib"
  done
  cp -L /lib64/ld-linux-x86-64.so.2 $r/lib64/
  # The loader's cache names the libraries in directories of their own
  # (ceph's), as on the host.
  cp /etc/ld.so.cache $r/etc/ld.so.cache
  cat >$r/init <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
mount -t tmpfs run /run
for m in virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci virtio_blk \
  virtio_console failover net_failover virtio_net bfq; do
  insmod /lib/modules/$m.ko
done
# A cgroup v2 host: every controller on the unified hierarchy, io enabled
# for the root's children.
mount -t cgroup2 none /sys/fs/cgroup
echo "+io +memory +pids" >/sys/fs/cgroup/cgroup.subtree_control
ip link set lo up
if ip link set eth0 up 2>/dev/null; then
  ip addr add 10.0.2.15/24 dev eth0
  ip route add default via 10.0.2.2
fi
n=0
while [ ! -b /dev/vda ] && [ $n -lt 50 ]; do sleep 0.1; n=$((n + 1)); done
# No udev: the virtio-serial ports by their names.
mkdir -p /dev/virtio-ports
for p in /sys/class/virtio-ports/*; do
  ln -sf "/dev/${p##*/}" "/dev/virtio-ports/$(cat "$p/name")"
done
echo "iofloor-v2guest: ready $(uname -r) $(cat /sys/block/vda/dev)"
# The host's command channel: a shell on the port, again whenever the host
# hangs up. The port is opened once, here, and stays open: one opener at a
# time, and a command that arrived while no one had the port open (between
# one shell's end and the next one's open) was found lost.
exec 3<>/dev/virtio-ports/iofloor.cmd
while true; do
  sh <&3 >&3 2>&3 3>&-
  sleep 0.2
done
INIT
  chmod +x $r/init
  mkdir -p "$out/v2"
  # Uncompressed: inflating ~100 MB under TCG would cost more than reading it.
  (cd $r && find . | cpio -o -H newc --quiet) >"$out/v2/base.cpio.tmp"
  mv "$out/v2/base.cpio.tmp" "$out/v2/base.cpio"
  echo "$v2_version_wanted" >"$out/v2/VERSION"
  echo "cgroup v2 guest image in $out/v2 ($version, $(du -h "$out/v2/base.cpio" | cut -f1))" >&2
}

# Both boot one vmlinuz and load its modules: built together from one
# download, so a newer kernel in the index never meets older modules.
build_load_image
build_v2_image
