#!/usr/bin/env bash
# test-rdma.sh: run the verbs code on Soft-RoCE inside a QEMU guest.
#
# The host kernel has no RDMA (and no modules), so this boots Debian's
# kernel under QEMU TCG (never KVM: /dev/kvm here is a software
# virtualizer that crashes a stock kernel), loads rdma_rxe, adds rxe0 on a
# veth pair and runs the test binaries built here with -tags verbs. The
# guest's console comes back on stdout; the script fails when any step in
# the guest failed, the guest did not finish, or it timed out.
#
# Everything the guest needs comes from Debian packages fetched with
# `apt-get download` into .cache/rdma/debs (nothing is installed on the
# host except qemu-system-x86 and cpio, which are installed when missing).
# The initramfs is cached under .cache/rdma and rebuilt when its inputs
# change. Recipe and findings: ../shared/research/softroce.md, docs/rdma.md.
#
# Usage: scripts/test-rdma.sh [step...]
#   steps: devinfo readbw verbs bench cluster (default: devinfo readbw verbs cluster)
# Env: RDMA_GUEST_TIMEOUT (s, whole guest, default 900),
#      RDMA_BENCH_ROUNDS (bench rounds, default 5), RDMA_BENCH_READS (1 MiB
#      reads per 16-caller phase and ib_read_bw iterations, default 96; a
#      1-caller phase does a third),
#      RDMA_STEP_TIMEOUT (s, each step, default 600),
#      RDMA_TEST_RUN (regexp passed to the verbs test binary's -test.run),
#      RDMA_GUEST_LOG (where the console is kept, default .cache/rdma/guest.log).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
CACHE=$ROOT/.cache/rdma
DEBS=$CACHE/debs
EXTRACT=$CACHE/root
GUEST_TIMEOUT=${RDMA_GUEST_TIMEOUT:-900}
STEP_TIMEOUT=${RDMA_STEP_TIMEOUT:-600}
LOG=${RDMA_GUEST_LOG:-$CACHE/guest.log}
GO=${GO:-go}
STEPS=("$@")
if ((${#STEPS[@]} == 0)); then
	STEPS=(devinfo readbw verbs cluster)
fi

say() { echo "test-rdma: $*" >&2; }
die() {
	say "FAIL: $*"
	exit 1
}

mkdir -p "$CACHE" "$DEBS"

# apt_update refreshes the package lists once per run, as root only: a fresh
# machine (CI) may have none, and then nothing resolves.
updated=
apt_update() {
	[[ -z $updated && $(id -u) == 0 ]] || return 0
	updated=1
	say "apt-get update"
	apt-get update -q >"$CACHE/apt-update.log" 2>&1 || die "apt-get update failed (see $CACHE/apt-update.log)"
}

# ---- host tools ----
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
command -v cpio >/dev/null || need+=(cpio)
if ((${#need[@]})); then
	if [[ $(id -u) != 0 ]]; then
		die "missing ${need[*]}: apt-get install ${need[*]}"
	fi
	say "installing ${need[*]}"
	apt_update
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" >"$CACHE/apt.log" 2>&1 ||
		die "apt-get install ${need[*]} failed (see $CACHE/apt.log)"
fi
command -v gcc >/dev/null || die "gcc is required (cgo)"
[[ -e /usr/include/infiniband/verbs.h ]] || {
	if [[ $(id -u) == 0 ]]; then
		apt_update
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends libibverbs-dev >"$CACHE/apt.log" 2>&1 ||
			die "apt-get install libibverbs-dev failed (see $CACHE/apt.log)"
	else
		die "libibverbs-dev is required to build with -tags verbs"
	fi
}

# ---- guest packages ----
kernel_pkg() { apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}'; }
KPKG=$(kernel_pkg)
if [[ -z $KPKG ]]; then
	apt_update
	KPKG=$(kernel_pkg)
fi
[[ -n $KPKG ]] || die "cannot resolve linux-image-amd64 (run apt-get update)"
PKGS=("$KPKG" busybox-static perftest ibverbs-utils iproute2 libibverbs1 ibverbs-providers librdmacm1 libibumad3 libpci3)
missing=()
for p in "${PKGS[@]}"; do
	compgen -G "$DEBS/${p}_*.deb" >/dev/null || missing+=("$p")
done
if ((${#missing[@]})); then
	say "apt-get download ${missing[*]}"
	(cd "$DEBS" && apt-get download "${missing[@]}" >"$CACHE/download.log" 2>&1) ||
		{ apt_update && (cd "$DEBS" && apt-get download "${missing[@]}" >"$CACHE/download.log" 2>&1); } ||
		die "apt-get download failed (see $CACHE/download.log; run apt-get update?)"
fi
stamp=$(ls "$DEBS" | sha256sum | cut -c1-16)
if [[ ! -e $EXTRACT/.stamp-$stamp ]]; then
	say "extracting packages"
	rm -rf "$EXTRACT"
	mkdir -p "$EXTRACT"
	for d in "$DEBS"/*.deb; do dpkg-deb -x "$d" "$EXTRACT"; done
	touch "$EXTRACT/.stamp-$stamp"
fi
KVER=${KPKG#linux-image-}
KIMG=$EXTRACT/boot/vmlinuz-$KVER
MODDIR=$EXTRACT/lib/modules/$KVER/kernel
[[ -e $KIMG && -d $MODDIR ]] || die "kernel $KVER not found in $EXTRACT"

# The uncompressed kernel boots through PVH, about 6 s faster under TCG.
VMLINUX=$CACHE/vmlinux-$KVER
if [[ ! -s $VMLINUX ]]; then
	off=$(grep -abo $'\xfd7zXZ\x00' "$KIMG" | head -1 | cut -d: -f1 || true)
	if [[ -n $off ]]; then
		# xz complains about the bytes after its stream; the ELF is whole.
		tail -c +$((off + 1)) "$KIMG" | xz -dc >"$VMLINUX.tmp" 2>/dev/null || true
	fi
	if [[ -s $VMLINUX.tmp && $(head -c 4 "$VMLINUX.tmp" | od -An -c | tr -d ' ') == 177ELF ]]; then
		mv "$VMLINUX.tmp" "$VMLINUX"
	else
		rm -f "$VMLINUX.tmp"
		VMLINUX=$KIMG
	fi
fi

# ---- test binaries ----
BINS=$CACHE/bin
mkdir -p "$BINS"
rm -f "$BINS"/*
has() { [[ " ${STEPS[*]} " == *" $1 "* ]]; }
if has verbs || has bench; then
	say "building test binaries (-tags verbs)"
	$GO test -c -tags verbs -o "$BINS/verbs.test" ./rdma/verbs
	$GO test -c -tags verbs -o "$BINS/auto.test" ./rdma/auto
fi
if has cluster; then
	say "building tidepool and its process tests (-tags verbs)"
	$GO build -tags verbs -o "$BINS/tidepool" ./cmd/tidepool
	$GO test -c -tags verbs -o "$BINS/tidepool.test" ./cmd/tidepool
fi

# ---- steps ----
RUN=${RDMA_TEST_RUN:-.}
steps_file=$CACHE/steps
: >"$steps_file"
add() { printf '%s\t%s\n' "$1" "$2" >>"$steps_file"; }
for s in "${STEPS[@]}"; do
	case $s in
	devinfo)
		add devinfo "/usr/bin/ibv_devices && /usr/bin/ibv_devinfo -d rxe0 && /usr/bin/rdma link show"
		;;
	readbw)
		# ib_read_bw loopback on rxe0: the limit of this setup. The server's
		# log is read once it has exited: its stdout is a file, so until
		# then the log may end mid-line (and take the RDMA-STEP line with it).
		add readbw "/usr/bin/ib_read_bw -d rxe0 -x 1 -F -s 1048576 -n 200 --report_gbits >/tmp/rbw-server.log 2>&1 & srv=\$!; sleep 1; /usr/bin/ib_read_bw -d rxe0 -x 1 -F -s 1048576 -n 200 --report_gbits 10.0.0.1; rc=\$?; wait \$srv || rc=1; cat /tmp/rbw-server.log; exit \$rc"
		;;
	verbs)
		add verbs "TIDEPOOL_RDMA_DEVICE=rxe0 /tests/verbs.test -test.v -test.count=1 -test.timeout=${STEP_TIMEOUT}s -test.run '$RUN'"
		# Two devices at once: the suite again, transfers sliced across them.
		add verbs-2dev "TIDEPOOL_RDMA_DEVICE=rxe0,rxe1 /tests/verbs.test -test.v -test.count=1 -test.timeout=${STEP_TIMEOUT}s -test.run 'TestConformance|TestMultiDevice|TestDeregisterMidRead|TestSliceRetriedOnOtherDevice|TestQPEvent'"
		# Asynchronous events: rxe2's link (veth2, carrier from veth3) goes
		# down and up under a transport using rxe0 and rxe2.
		add verbs-events "TIDEPOOL_RDMA_DEVICE=rxe0,rxe2 TIDEPOOL_RDMA_EVENT_LINK=veth3 /tests/verbs.test -test.v -test.count=1 -test.timeout=${STEP_TIMEOUT}s -test.run 'TestPortEvents'"
		add auto "TIDEPOOL_RDMA_DEVICE=rxe0 TIDEPOOL_RDMA_NETDEV=veth0 /tests/auto.test -test.v -test.count=1 -test.timeout=${STEP_TIMEOUT}s -test.run '$RUN'"
		;;
	bench)
		# Interleaved rounds of ib_read_bw and 1 MiB summed reads over
		# verbs and tcp (1 and 16 callers) in this one boot; per-round
		# ratios, medians and a CPU profile of the test process.
		add bench "TIDEPOOL_RDMA_DEVICE=rxe0 TIDEPOOL_RDMA_BENCH_IP=10.0.0.1 TIDEPOOL_RDMA_BENCH_ROUNDS=${RDMA_BENCH_ROUNDS:-5} TIDEPOOL_RDMA_BENCH_READS=${RDMA_BENCH_READS:-96} /tests/verbs.test -test.v -test.count=1 -test.timeout=${STEP_TIMEOUT}s -test.run '^TestBenchRounds\$' -test.cpuprofile /tmp/cpu.prof; rc=\$?; echo RDMA-PPROF-BEGIN; base64 /tmp/cpu.prof; echo RDMA-PPROF-END; exit \$rc"
		;;
	cluster)
		# Two real sidecars on rxe0: a fetch over RDMA, the owner killed.
		add cluster "TIDEPOOL_RDMA_DEVICE=rxe0 TIDEPOOL_BIN=/tests/tidepool /tests/tidepool.test -test.v -test.count=1 -test.timeout=${STEP_TIMEOUT}s -test.run '^TestRDMA'"
		;;
	selftest-fail)
		# Proves the harness: a failing step must fail the run.
		add selftest-fail "echo this step fails on purpose; exit 3"
		;;
	*) die "unknown step $s (devinfo readbw verbs bench cluster)" ;;
	esac
done

# ---- initramfs ----
STAGE=$CACHE/stage
GUEST_BINS=(/usr/sbin/ip /usr/bin/rdma /usr/bin/ibv_devices /usr/bin/ibv_devinfo /usr/bin/ibv_rc_pingpong /usr/bin/ib_read_bw /usr/bin/ib_write_bw)
MODS=(crypto/crc32_generic.ko net/ipv4/udp_tunnel.ko net/ipv6/ip6_udp_tunnel.ko drivers/infiniband/core/ib_core.ko
	drivers/infiniband/core/ib_uverbs.ko drivers/infiniband/sw/rxe/rdma_rxe.ko drivers/net/veth.ko)
inputs=$( (
	sha256sum scripts/rdma-guest-init.sh "$0" "$steps_file" "$BINS"/* 2>/dev/null
	echo "$stamp $KVER"
) | sha256sum | cut -c1-16)
INITRD=$CACHE/initrd-$inputs.gz
if [[ ! -s $INITRD ]]; then
	say "building initramfs"
	rm -rf "$STAGE" "$CACHE"/initrd-*.gz
	mkdir -p "$STAGE"/{bin,dev,proc,sys,tmp,root,etc,modules,tests,usr/bin,usr/sbin,usr/lib/x86_64-linux-gnu,usr/lib64}
	ln -s usr/lib "$STAGE/lib"
	ln -s usr/lib64 "$STAGE/lib64"
	ln -s ../bin/busybox "$STAGE/usr/bin/busybox" 2>/dev/null || true
	cp "$EXTRACT/bin/busybox" "$STAGE/bin/busybox"
	cp scripts/rdma-guest-init.sh "$STAGE/init"
	chmod +x "$STAGE/init"
	LIBPATH=$EXTRACT/usr/lib/x86_64-linux-gnu:$EXTRACT/lib/x86_64-linux-gnu
	copy_with_libs() { # src dst
		install -D -m 0755 "$1" "$STAGE$2"
		local l
		while read -r l; do
			[[ -z $l ]] && continue
			[[ $l == *"not found"* ]] && die "$1: library $l"
			local lib
			lib=$(awk '{for (i=1;i<=NF;i++) if ($i ~ /^\//) {print $i; exit}}' <<<"$l")
			[[ -n $lib && -e $lib ]] || continue
			local base
			base=$(basename "$lib")
			if [[ $base == ld-linux-x86-64.so.2 ]]; then
				[[ -e $STAGE/usr/lib64/$base ]] || cp -L "$lib" "$STAGE/usr/lib64/$base"
			else
				[[ -e $STAGE/usr/lib/x86_64-linux-gnu/$base ]] || cp -L "$lib" "$STAGE/usr/lib/x86_64-linux-gnu/$base"
			fi
		done < <(LD_LIBRARY_PATH=$LIBPATH ldd "$1" 2>/dev/null | grep -v 'linux-vdso' || true)
	}
	for b in "${GUEST_BINS[@]}"; do
		src=$EXTRACT$b
		[[ -e $src ]] || src=$b
		[[ -e $src ]] || die "guest binary $b not found"
		copy_with_libs "$src" "$b"
	done
	for b in "$BINS"/*; do [[ -e $b ]] && copy_with_libs "$b" "/tests/$(basename "$b")"; done
	# Every busybox applet that is not a real binary above.
	for a in $("$STAGE/bin/busybox" --list); do
		for d in bin usr/bin usr/sbin; do
			[[ -e $STAGE/$d/$a ]] && continue 2
		done
		ln -s busybox "$STAGE/bin/$a"
	done
	# The rxe verbs provider (dlopened, so not in any ldd closure).
	mkdir -p "$STAGE/etc/libibverbs.d"
	cp "$EXTRACT/etc/libibverbs.d/rxe.driver" "$STAGE/etc/libibverbs.d/"
	mkdir -p "$STAGE/usr/lib/x86_64-linux-gnu/libibverbs"
	cp -L "$EXTRACT"/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so "$STAGE/usr/lib/x86_64-linux-gnu/libibverbs/"
	: >"$STAGE/modules/order"
	for m in "${MODS[@]}"; do
		src=$MODDIR/$m
		for ext in "" .xz .zst; do
			if [[ -e $src$ext ]]; then
				case $ext in
				.xz) xz -dc "$src$ext" >"$STAGE/modules/$(basename "$m")" ;;
				.zst) zstd -dc "$src$ext" >"$STAGE/modules/$(basename "$m")" ;;
				*) cp "$src" "$STAGE/modules/" ;;
				esac
				echo "$(basename "$m")" >>"$STAGE/modules/order"
				continue 2
			fi
		done
		die "module $m not found under $MODDIR"
	done
	cp "$steps_file" "$STAGE/tests/steps"
	echo "root:x:0:0:root:/root:/bin/sh" >"$STAGE/etc/passwd"
	printf '127.0.0.1 localhost\n10.0.0.1 guest\n' >"$STAGE/etc/hosts"
	(cd "$STAGE" && find . | cpio -o -H newc --quiet | gzip -1 >"$INITRD.tmp")
	mv "$INITRD.tmp" "$INITRD"
	rm -rf "$STAGE"
	say "initramfs $(du -h "$INITRD" | cut -f1)"
fi

# ---- boot ----
say "booting the guest under TCG (timeout ${GUEST_TIMEOUT}s; console in $LOG)"
set +e
timeout --kill-after=10 "$GUEST_TIMEOUT" qemu-system-x86_64 -accel tcg -cpu max -m 3072 -smp 2 \
	-kernel "$VMLINUX" -initrd "$INITRD" \
	-append "console=ttyS0 quiet panic=-1 rdma.step_timeout=$STEP_TIMEOUT" \
	-nographic -no-reboot -nic none -monitor none -serial stdio </dev/null 2>&1 | tr -d '\r' | tee "$LOG" |
	sed -u '/^RDMA-PPROF-BEGIN/,/^RDMA-PPROF-END/d' # the profile is in $LOG
qrc=${PIPESTATUS[0]}
set -e

# ---- verdict ----
echo
say "summary:"
grep -E '^RDMA-STEP [^ ]+ rc=' "$LOG" | sed 's/^/  /' >&2 || true
if ((qrc == 124 || qrc == 137)); then
	die "the guest did not finish within ${GUEST_TIMEOUT}s (console: $LOG)"
fi
done_line=$(grep -a '^RDMA-GUEST-DONE rc=' "$LOG" | tail -1 || true)
[[ -n $done_line ]] || die "the guest stopped without a result (qemu rc $qrc; console: $LOG)"
for s in $(cut -f1 "$steps_file"); do
	grep -aq "^RDMA-STEP $s rc=" "$LOG" || die "step $s did not run (console: $LOG)"
done
if grep -aq '^BENCH-SUMMARY' "$LOG"; then
	say "bench (Soft-RoCE under TCG: says nothing about real NICs):"
	grep -aE '^ *rounds_test.go:[0-9]+: round ' "$LOG" | sed 's/^ *rounds_test.go:[0-9]*: /  /' >&2 || true
	grep -a '^BENCH-SUMMARY' "$LOG" | sed 's/^BENCH-SUMMARY /  /' >&2
	if grep -aq '^RDMA-PPROF-END' "$LOG"; then
		sed -n '/^RDMA-PPROF-BEGIN/,/^RDMA-PPROF-END/p' "$LOG" | grep -av '^RDMA-PPROF' | base64 -d >"$CACHE/bench-cpu.prof" 2>/dev/null &&
			say "CPU profile of the bench process: $CACHE/bench-cpu.prof (go tool pprof -top $BINS/verbs.test $CACHE/bench-cpu.prof)" &&
			$GO tool pprof -top -nodecount=30 "$BINS/verbs.test" "$CACHE/bench-cpu.prof" 2>/dev/null | sed 's/^/  /' >&2 || true
	fi
fi
if [[ $done_line != "RDMA-GUEST-DONE rc=0" ]]; then
	grep -aE -- '^(--- FAIL|FAIL|panic:|RDMA-INIT)' "$LOG" | head -40 >&2 || true
	die "$done_line (console: $LOG)"
fi
say "all guest steps passed"
