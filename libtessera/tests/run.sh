#!/usr/bin/env bash
# Runs libtessera's tests on each build flavour: plain (the library
# preloaded with LD_PRELOAD), asan and tsan (linked, as sanitizer runtimes
# must come first), then, as root, the shipped library through a read-only
# /etc/ld.so.preload in a private mount namespace. Each test gets a scratch
# directory (its limits, its usage region, the fake GPU's state); nothing
# outside it is written.
set -uo pipefail
out=$1
shift
scratch=$(mktemp -d "${TMPDIR:-/tmp}/libtessera-test.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
failed=0

# run <flavour> <name> <program> [args…]: one test in a fresh directory.
run() {
	local flavour=$1 name=$2
	shift 2
	local dir=$scratch/$flavour-$name
	mkdir -p "$dir"
	local env=(TESSERA_TEST_DIR="$dir" FAKE_GPU_STATE="$dir/fake-gpu" TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" ASAN_OPTIONS="detect_leaks=0:halt_on_error=1" UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1")
	[ "$flavour" = plain ] && [ "${NOPRELOAD:-}" = "" ] && env+=(LD_PRELOAD="$out/plain/libtessera.so")
	if ! env "${env[@]}" "$@" >"$dir/log" 2>&1; then
		echo "FAIL [$flavour] $name:"
		sed 's/^/    /' "$dir/log"
		failed=1
	else
		sed "s/^/[$flavour] /" "$dir/log" | grep -v '^\[.*\] libtessera: ' || true
	fi
}

# The shipped library asks nothing of the C library newer than glibc 2.17
# (2012): a tenant image with an older glibc than the build's must still
# preload it.
newest=$(objdump -T "$out/libtessera.so" | grep -oE 'GLIBC_[0-9]+\.[0-9]+(\.[0-9]+)?' | sort -uV | tail -1)
if [ "$(printf '%s\nGLIBC_2.17\n' "$newest" | sort -V | tail -1)" != GLIBC_2.17 ]; then
	echo "FAIL [shipped] needs $newest of the C library; an older tenant image could not preload it"
	failed=1
else
	echo "[shipped] ok   needs nothing newer than $newest of the C library"
fi

for f in "$@"; do
	b=$out/$f
	run "$f" memory "$b/memory"
	run "$f" entry "$b/entry"
	LD_LIBRARY_PATH=$b run "$f" noload "$b/noload"
	run "$f" fork "$b/fork"
	run "$f" processes "$b/processes"
	run "$f" threads "$b/threads"
	run "$f" limits-parse "$b/limits" parse
	run "$f" limits-missing "$b/limits" missing
	mkdir -p "$scratch/$f-limits-bad" && echo "GPU-x 12 400" >"$scratch/$f-limits-bad/limits"
	run "$f" limits-bad "$b/limits" bad
	run "$f" limits-unlisted "$b/limits" unlisted
	run "$f" limits-no-opt-out env CUDA_DISABLE_CONTROL=1 TESSERA_DISABLE=1 TESSERA_GPU_MEMORY_LIMIT_MIB=0=999999 "$b/limits" no-opt-out
	# The split under TSan and ASan is not the point there (their
	# slowdown moves it): they run the throttle's code for races.
	if [ "$f" = plain ]; then
		run "$f" compute-plain "$b/compute" plain plain
		run "$f" compute-graph "$b/compute" graph plain
		run "$f" compute-cooperative "$b/compute" cooperative ex
		run "$f" compute-threads "$b/compute" threads plain
		NOPRELOAD=1 run "$f" compute-control "$b/compute" plain plain --control
		NOPRELOAD=1 run "$f" compute-graph-control "$b/compute" graph plain --control
	else
		run "$f" compute-graph "$b/compute" graph cooperative --race-only
		run "$f" compute-threads "$b/compute" threads plain --race-only
	fi
done

# The shipped library (fixed paths, no test hooks) as the agent puts it in
# a container: /etc/ld.so.preload and the limits read-only, the usage
# region's directory at /run/tessera, LD_PRELOAD unset. A private mount
# namespace, with an overlay on /etc and a tmpfs on /run, so the host's
# own files are never touched.
if [ "$(id -u)" = 0 ] && command -v unshare >/dev/null && unshare --mount --propagation private true 2>/dev/null; then
	ns=$scratch/ns
	mkdir -p "$ns/upper/tessera" "$ns/work" "$ns/etc" "$ns/decoy"
	echo "$(cd "$out" && pwd)/libtessera.so" >"$ns/upper/ld.so.preload"
	echo "GPU-00000000-0000-0000-0000-000000000001 1048576 50" >"$ns/limits"
	echo "GPU-00000000-0000-0000-0000-000000000001 1099511627776 100" >"$ns/decoy/limits"
	prog=$(cd "$out/plain" && pwd)/limits
	if unshare --mount --propagation private bash -euc '
		mount -t overlay overlay -o lowerdir=/etc,upperdir='"$ns"'/upper,workdir='"$ns"'/work /etc
		touch /etc/tessera/limits
		mount --bind '"$ns"'/limits /etc/tessera/limits
		mount -o remount,bind,ro /etc/tessera/limits
		mount -t tmpfs tmpfs /run
		mkdir /run/tessera
		if (echo "GPU-x 1 1" > /etc/tessera/limits) 2>/dev/null; then echo "the limits file is writable"; exit 1; fi
		env -u LD_PRELOAD CUDA_DISABLE_CONTROL=1 TESSERA_TEST_DIR='"$ns"'/decoy FAKE_GPU_STATE='"$ns"'/fake-gpu '"$prog"' no-opt-out
	' >"$ns/log" 2>&1; then
		sed 's/^/[shipped, ld.so.preload] /' "$ns/log" | grep -v 'libtessera: '
	else
		echo "FAIL [shipped, ld.so.preload]:"
		sed 's/^/    /' "$ns/log"
		failed=1
	fi
else
	echo "skip [shipped, ld.so.preload]: needs root and a private mount namespace (unshare); the other flavours ran"
fi

if [ $failed != 0 ]; then
	echo "libtessera: tests FAILED"
	exit 1
fi
echo "libtessera: all tests passed"
