#!/usr/bin/env bash
# Builds the smallest bootable guest for iofloor's real-VM tests: Debian's
# cloud kernel plus a busybox initramfs that loads the virtio block modules
# and reads every virtio disk with O_DIRECT forever (QD1, 4 KiB each), so the
# host sees a guest's I/O through QEMU's virtio-blk path. Output:
#   $IOFLOOR_GUEST_DIR (default /var/cache/iofloor/guest)/{vmlinuz,initramfs.gz,VERSION}
# Needs root, qemu-system-x86 and busybox-static (scripts/deps.sh installs them).
set -euo pipefail
out=${IOFLOOR_GUEST_DIR:-/var/cache/iofloor/guest}
# The image's version: an older one (reading only its first disk) is rebuilt.
version_wanted=2
if [[ -s $out/vmlinuz && -s $out/initramfs.gz && $(cat "$out/VERSION" 2>/dev/null) == "$version_wanted" ]]; then
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
mods=kernel/lib/modules/$version/kernel/drivers

mkdir -p root/{bin,dev,proc,sys,lib/modules}
cp /bin/busybox root/bin/busybox
for m in virtio/virtio_ring virtio/virtio virtio/virtio_pci_modern_dev virtio/virtio_pci_legacy_dev \
  virtio/virtio_pci block/virtio_blk; do
  cp "$mods/$m.ko" root/lib/modules/
done
cat >root/init <<'EOF'
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
EOF
chmod +x root/init
mkdir -p "$out"
(cd root && find . | cpio -o -H newc --quiet | gzip -1) >"$out/initramfs.gz.tmp"
cp "kernel/boot/vmlinuz-$version" "$out/vmlinuz.tmp"
mv "$out/initramfs.gz.tmp" "$out/initramfs.gz"
mv "$out/vmlinuz.tmp" "$out/vmlinuz"
echo "$version_wanted" >"$out/VERSION"
echo "guest image in $out ($version)" >&2
