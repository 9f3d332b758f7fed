#!/bin/busybox sh
# /init of the Soft-RoCE test guest (scripts/test-rdma.sh builds the
# initramfs around it). It loads rdma_rxe, brings up rxe0 on a veth pair,
# runs every step listed in /tests/steps (one "name<TAB>command" a line),
# prints one RDMA-STEP line per step and a final RDMA-GUEST-DONE line that
# the host parses, then powers the guest off. Nothing here may hang: every
# step runs under the timeout given on the kernel command line.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
export LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu
export HOME=/root TMPDIR=/tmp
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t sysfs sysfs /sys
/bin/busybox mount -t devtmpfs devtmpfs /dev
/bin/busybox mount -t tmpfs tmpfs /tmp
/bin/busybox mkdir -p /dev/shm /run
/bin/busybox mount -t tmpfs tmpfs /dev/shm

step_timeout=600
for a in $(cat /proc/cmdline); do
	case "$a" in
	rdma.step_timeout=*) step_timeout=${a#rdma.step_timeout=} ;;
	esac
done

fail=0
say() { echo "RDMA-INIT: $*"; }
done_() {
	say "dmesg tail:"
	dmesg | tail -n 15 | sed 's/^/RDMA-DMESG: /'
	echo "RDMA-GUEST-DONE rc=$1"
	sync
	poweroff -f
	sleep 5
	echo o >/proc/sysrq-trigger
}

# crc32_generic first: rxe allocates the crc32 shash when a link is added and
# cannot request_module it here (no modprobe, no module tree).
for m in $(cat /modules/order); do
	if ! insmod "/modules/$m" 2>/tmp/insmod.err; then
		if ! grep -q 'File exists' /tmp/insmod.err; then
			say "insmod $m failed: $(cat /tmp/insmod.err)"
			done_ 2
		fi
	fi
done

ip=/usr/sbin/ip
$ip link set lo up
$ip link add veth0 type veth peer name veth1 || done_ 3
$ip addr add 10.0.0.1/24 dev veth0
$ip addr add 10.0.0.2/24 dev veth1
$ip link set veth0 up
$ip link set veth1 up
# A second pair for rxe2: taking veth3 down takes veth2's carrier, and so
# rxe2's port, away without touching rxe0/rxe1 (the port event test).
$ip link add veth2 type veth peer name veth3 || done_ 3
$ip addr add 10.0.1.1/24 dev veth2
$ip addr add 10.0.1.2/24 dev veth3
$ip link set veth2 up
$ip link set veth3 up
# rxe0 on veth0 for everything; rxe1 on veth1 for the multi-device tests
# and rxe2 on veth2 for the port event test (each pairs with itself in
# loopback: two rxe devices talking to each other is not what is tested
# here).
/usr/bin/rdma link add rxe0 type rxe netdev veth0 || done_ 4
/usr/bin/rdma link add rxe1 type rxe netdev veth1 || done_ 4
/usr/bin/rdma link add rxe2 type rxe netdev veth2 || done_ 4
# A port turns ACTIVE once the veth has carrier.
for d in rxe0 rxe1 rxe2; do
	i=0
	until /usr/bin/rdma link show $d/1 2>/dev/null | grep -q 'state ACTIVE'; do
		i=$((i + 1))
		if [ $i -gt 100 ]; then
			say "$d never became ACTIVE: $(/usr/bin/rdma link show 2>&1)"
			done_ 5
		fi
		sleep 0.1
	done
	say "$(/usr/bin/rdma link show $d/1)"
done

cd /tests || done_ 6
while IFS='	' read -r name cmd; do
	[ -z "$name" ] && continue
	case "$name" in '#'*) continue ;; esac
	echo "RDMA-STEP-BEGIN $name"
	timeout "$step_timeout" sh -c "$cmd" 2>&1
	rc=$?
	# A step's output need not end with a newline; the marker must start
	# a line of its own for the host to find it.
	echo
	echo "RDMA-STEP $name rc=$rc"
	[ $rc -ne 0 ] && fail=1
done </tests/steps
done_ $fail
