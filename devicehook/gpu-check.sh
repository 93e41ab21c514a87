#!/usr/bin/env bash
# gpu-check.sh: asserts that libgpupack-hook.so holds on a machine with a
# real NVIDIA GPU. Needs only gcc and the driver (libcuda.so.1,
# libnvidia-ml.so.1): no nvcc, no CUDA toolkit. Kernels are PTX text loaded
# through cuModuleLoadData (testprog/gpucheck.c). PyTorch checks run only
# when torch with CUDA is importable.
#
#   devicehook/gpu-check.sh                 # GPU 0, a 4 GiB limit
#   GPU_CHECK_DEVICE=1 devicehook/gpu-check.sh
#   devicehook/gpu-check.sh --compile-only  # build the C part, check syntax
#   GPU_CHECK_FAKE=1 devicehook/gpu-check.sh # self-test against the fake
#                                            # driver (go test runs it)
#
# Checks (each prints PASS/FAIL/SKIP with its figures):
#   limits: cuMemGetInfo total = limit; cuMemAlloc, cuMemCreate (VMM),
#     cuMemAllocAsync (pools) over the limit refused; filling stops at the
#     limit, context included; a refused request leaves NVML's used alone;
#     nvidia-smi under the hook reports total <= limit
#   context overhead charged (used > 0 right after the context)
#   two processes on one shared cache share one limit; SIGKILL reclaim
#   SM share: 30 % alone, and a 30/70 pair, within +-5 points of the
#     unthrottled throughput of the same PTX busy kernel
#   overhead (same binary, with/without LD_PRELOAD): alloc+free pair
#     <= 200 ns added, empty launch <= 50 ns added
#   limits file naming the GPU by UUID: its limit holds; another UUID gets
#     no memory (needs unprivileged mount namespaces)
#   PyTorch (when present): OOM past the limit through the runtime, with
#     and without expandable_segments (VMM)
# Ends with "N passed, M failed, K skipped"; exit status non-zero on any
# failure. A probe that dies (a refused context, a crash) is a FAIL line
# and the checks go on: the summary is always printed.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
dev=${GPU_CHECK_DEVICE:-0}
limit_mib=${GPU_CHECK_LIMIT_MIB:-4096}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

build() {
	gcc -O2 -std=gnu11 -Wall -Wextra -Wno-unused-parameter -o "$work/gpucheck" "$here/testprog/gpucheck.c" \
		"$@" -l:libcuda.so.1 -l:libnvidia-ml.so.1
}

if [ "${1:-}" = "--compile-only" ]; then
	bash -n "$0"
	make -s -C "$here" build/fake/libcuda.so.1 build/fake/libnvidia-ml.so.1
	build -L"$here/build/fake"
	echo "compile-only: gpu-check.sh parses, testprog/gpucheck.c builds"
	exit 0
fi

if [ -n "${GPU_CHECK_FAKE:-}" ]; then
	# Self-test of this script against the fake driver (go test runs it):
	# the figures mean nothing about a GPU.
	make -s -C "$here" build/libgpupack-hook.so build/fake/libcuda.so.1 build/fake/libnvidia-ml.so.1
	export LD_LIBRARY_PATH="$here/build/fake" FAKECUDA_CTX_MEM=$((300 << 20)) FAKECUDA_PID_OFFSET=4000000
	export FAKECUDA_STATE="$work/device"
	hook="$here/build/libgpupack-hook.so"
	build -L"$here/build/fake"
else
	command -v nvidia-smi >/dev/null || { echo "FAIL: nvidia-smi not found: not a GPU machine"; exit 2; }
	nvidia-smi -i "$dev" --query-gpu=name,memory.total,driver_version --format=csv,noheader
	make -s -C "$here" build/libgpupack-hook.so
	hook="$here/build/libgpupack-hook.so"
	# The fake driver lives in build/fake: keep it off the library path so
	# the real libcuda.so.1 is the one loaded.
	if [ -n "${LD_LIBRARY_PATH:-}" ]; then
		LD_LIBRARY_PATH=$(printf '%s' "$LD_LIBRARY_PATH" | tr ':' '\n' | { grep -v "/build/fake" || true; } | paste -sd: -)
		export LD_LIBRARY_PATH
	fi
	unset FAKECUDA_STATE FAKECUDA_MEM FAKECUDA_PID_OFFSET FAKECUDA_CTX_MEM FAKENVML_SAMPLE_MS
	build
fi
gc="$work/gpucheck"
# Set-up done. From here a failing command is a FAIL line, never the end
# of the script: set -e stopped at the first probe that exited non-zero,
# with no FAIL line and no summary (review 15).
set +e

passed=0 failed=0 skipped=0
pass() { echo "PASS: $*"; passed=$((passed + 1)); }
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }
skip() { echo "SKIP: $*"; skipped=$((skipped + 1)); }
# check CONDITION MESSAGE: awk-evaluated condition, operands and operators
# separated by spaces. A figure a dead probe never printed is empty, which
# leaves two operators side by side (awk would read "+ + 0 <= L" as true):
# that is a FAIL, never a pass.
check() {
	local t prev=op toks
	read -ra toks <<<"$1"
	for t in "${toks[@]}" '&&'; do
		case $t in
		'+' | '-' | '*' | '/' | '==' | '!=' | '<=' | '>=' | '<' | '>' | '&&' | '||')
			if [ "$prev" = op ]; then
				fail "$2 (a figure is missing: $1)"
				return
			fi
			prev=op
			;;
		*) prev=num ;;
		esac
	done
	if awk "BEGIN{exit !($1)}"; then pass "$2"; else fail "$2"; fi
}
kv() { printf '%s\n' "$1" | tr ' ' '\n' | sed -n "s/^$2=//p" | head -1; }

plain() { env CUDA_VISIBLE_DEVICES="$dev" "$@"; }
hooked() {
	env CUDA_VISIBLE_DEVICES="$dev" LD_PRELOAD="$hook" \
		CUDA_DEVICE_MEMORY_LIMIT="${limit_mib}m" \
		CUDA_DEVICE_MEMORY_SHARED_CACHE="${cache:-$work/cache}" \
		LIBCUDA_LOG_LEVEL="${LIBCUDA_LOG_LEVEL:-1}" "$@"
}
limit=$((limit_mib * 1024 * 1024))

# ---- memory limits through the driver API -----------------------------------
out=$(hooked "$gc" info) || fail "gpucheck info under the hook exited $?: $out"
total=$(kv "$out" total) free=$(kv "$out" free)
check "$total == $limit" "cuMemGetInfo total under the hook is the limit ($total == $limit)"
ctxcost=$((total - free))
check "$ctxcost > 0" "context overhead is charged (used right after the context: $((ctxcost >> 20)) MiB)"

out=$(hooked "$gc" fill 64) || fail "gpucheck fill 64 under the hook exited $?: $out"
bytes=$(kv "$out" bytes)
check "$bytes + $ctxcost <= $limit && $bytes + $ctxcost > $limit - 64*1048576" \
	"filling in 64 MiB chunks stops at the limit ($((bytes >> 20)) MiB + context $((ctxcost >> 20)) MiB of $limit_mib MiB)"

out=$(hooked "$gc" refuse $((limit_mib + 1024))) || fail "gpucheck refuse under the hook exited $?: $out"
check "$(kv "$out" rc) == 2" "cuMemAlloc_v2 of limit+1 GiB refused with CUDA_ERROR_OUT_OF_MEMORY"
check "$(kv "$out" nvml_after) == $(kv "$out" nvml_before)" \
	"a refused request leaves NVML's used memory unchanged ($(kv "$out" nvml_before) -> $(kv "$out" nvml_after))"

out=$(hooked "$gc" vmm $((limit_mib + 1024))) || fail "gpucheck vmm under the hook exited $?: $out"
check "$(kv "$out" rc) == 2" "cuMemCreate (VMM) of limit+1 GiB refused"
out=$(hooked "$gc" async $((limit_mib + 1024))) || fail "gpucheck async under the hook exited $?: $out"
check "$(kv "$out" rc) == 2" "cuMemAllocAsync (pool) of limit+1 GiB refused"

smi=$(command -v nvidia-smi >/dev/null && hooked nvidia-smi -i 0 --query-gpu=memory.total,memory.used --format=csv,noheader,nounits 2>/dev/null || true)
if [ -n "$smi" ]; then
	smi_total=$(printf '%s' "$smi" | cut -d, -f1 | tr -d ' ')
	check "$smi_total <= $limit_mib" "nvidia-smi under the hook reports total $smi_total MiB <= $limit_mib MiB"
else
	skip "nvidia-smi under the hook printed nothing"
fi

# ---- two processes, one cache; SIGKILL reclaim ------------------------------
cache="$work/shared"
# sh prints its pid, then becomes the holder: that pid is the one to kill.
coproc HOLD { hooked sh -c 'echo "$$"; exec "$@"' sh "$gc" hold 256 $((limit_mib / 2)); }
holdjob=$HOLD_PID
holder='' line=''
read -r holder <&"${HOLD[0]}" && read -r line <&"${HOLD[0]}" || fail "gpucheck hold under the hook did not start: '$holder' '$line'"
held=$(kv "$line" held)
out=$(hooked "$gc" fill 256) || fail "gpucheck fill 256 (second process) under the hook exited $?: $out"
rest=$(kv "$out" bytes)
check "$held + $rest + 2*$ctxcost <= $limit && $held + $rest + 2*$ctxcost > $limit - 256*1048576" \
	"two processes on one cache share the limit ($((held >> 20)) + $((rest >> 20)) MiB + 2 contexts of $((ctxcost >> 20)) MiB)"
[ -n "$holder" ] && kill -9 "$holder"
wait "$holdjob" 2>/dev/null
sleep 0.2
out=$(hooked "$gc" fill 256) || fail "gpucheck fill 256 after the SIGKILL exited $?: $out"
after=$(kv "$out" bytes)
check "$after >= $held" "after SIGKILL of the holder its share is reclaimed ($((after >> 20)) MiB >= $((held >> 20)) MiB)"
unset cache

# ---- SM share ---------------------------------------------------------------
# Counted after a warm-up that covers the limiter's calibration (two NVML
# samples: up to 2 s where the driver samples once a second).
secs=${GPU_CHECK_SM_SECS:-10} warm=${GPU_CHECK_SM_WARM:-3} band=${GPU_CHECK_SM_BAND:-5}
if [ -n "${GPU_CHECK_FAKE:-}" ]; then
	# The fake device runs a 1024-block busy kernel in 1.024 ms; measuring
	# it on a loaded 2-core VM would measure the CPU instead.
	base=976.56
else
	out=$(plain "$gc" busy "$secs" "$warm") || fail "gpucheck busy without the hook exited $?: $out"
	base=$(kv "$out" kernels_per_s)
fi
echo "unthrottled busy kernel: $base kernels/s"
out=$(CUDA_DEVICE_SM_LIMIT=30 hooked "$gc" busy "$secs" "$warm") || fail "gpucheck busy at 30 % exited $?: $out"
alone=$(kv "$out" kernels_per_s)
share=$(awk "BEGIN{printf \"%.1f\", 100*$alone/$base}")
check "$share >= 30 - $band && $share <= 30 + $band" "30 % alone: $share % of the unthrottled rate (+-$band)"
( CUDA_DEVICE_SM_LIMIT=30 cache="$work/c30" hooked "$gc" busy "$secs" "$warm" >"$work/p30" ) &
j30=$!
( CUDA_DEVICE_SM_LIMIT=70 cache="$work/c70" hooked "$gc" busy "$secs" "$warm" >"$work/p70" ) &
j70=$!
wait "$j30" || fail "gpucheck busy at 30 % (pair) exited $?"
wait "$j70" || fail "gpucheck busy at 70 % (pair) exited $?"
s30=$(awk "BEGIN{printf \"%.1f\", 100*$(kv "$(cat "$work/p30")" kernels_per_s)/$base}")
s70=$(awk "BEGIN{printf \"%.1f\", 100*$(kv "$(cat "$work/p70")" kernels_per_s)/$base}")
check "$s30 >= 30 - $band && $s30 <= 30 + $band && $s70 >= 70 - $band && $s70 <= 70 + $band" "30/70 pair: $s30 % / $s70 % (+-$band)"

# ---- overhead ---------------------------------------------------------------
out=$(plain "$gc" bench-alloc 200000) || fail "gpucheck bench-alloc without the hook exited $?: $out"
pa=$(kv "$out" ns_per_pair)
out=$(hooked "$gc" bench-alloc 200000) || fail "gpucheck bench-alloc under the hook exited $?: $out"
ha=$(kv "$out" ns_per_pair)
if [ -n "${GPU_CHECK_FAKE:-}" ]; then
	skip "fake driver: overhead not asserted (alloc+free $pa / $ha ns, launch below)"
else
	check "$ha - $pa <= 200" "alloc+free pair: $pa ns plain, $ha ns hooked (<= 200 ns per pair added)"
fi
out=$(plain "$gc" bench-launch 200000) || fail "gpucheck bench-launch without the hook exited $?: $out"
pl=$(kv "$out" ns_per_launch)
out=$(hooked "$gc" bench-launch 200000) || fail "gpucheck bench-launch under the hook exited $?: $out"
hl=$(kv "$out" ns_per_launch)
if [ -n "${GPU_CHECK_FAKE:-}" ]; then
	skip "fake driver: launch overhead not asserted ($pl / $hl ns)"
else
	check "$hl - $pl <= 50" "unthrottled launch: $pl ns plain, $hl ns hooked (<= 50 ns added)"
fi

# ---- the limits file names the GPU by UUID (issue 14 finding 7) -------------
# The real driver's cuDeviceGetUuid must give the bytes of NVML's UUID
# string: with the GPU's UUID in /etc/gpupack/limits the file's limit holds;
# with another UUID the hook says so and gives the device no memory. The
# file must be a read-only mount at the real path: an unprivileged mount
# namespace, /etc overlaid (skipped where that is not allowed).
if [ -n "${GPU_CHECK_FAKE:-}" ]; then
	uuid=$(printf 'GPU-fa4e0000-0000-4000-8000-0000000000%02x' "$dev")
else
	# NVML's index order; CUDA_VISIBLE_DEVICES=$dev is CUDA's (the same on
	# a node of one GPU model, or with CUDA_DEVICE_ORDER=PCI_BUS_ID).
	uuid=$(nvidia-smi -i "$dev" --query-gpu=uuid --format=csv,noheader | tr -d ' ')
fi
infile() { # infile TEXT ARGS...: ARGS, hooked, with TEXT at /etc/gpupack/limits
	printf '%s' "$1" >"$work/limits"
	shift
	mkdir -p "$work/u" "$work/w"
	hooked unshare -m -r sh -c 'set -e
mount -t overlay overlay -o lowerdir=/etc,upperdir="$1"/u,workdir="$1"/w /etc
mkdir -p /etc/gpupack && touch /etc/gpupack/limits
mount --bind "$1"/limits /etc/gpupack/limits && mount -o remount,bind,ro /etc/gpupack/limits
shift; exec "$@"' sh "$work" "$@"
}
if infile "" true 2>"$work/uuid.log"; then
	out=$(infile "CUDA_DEVICE_MEMORY_LIMIT_0=${limit_mib}m
GPUPACK_DEVICE_UUID_0=$uuid
" "$gc" info 2>"$work/uuid.log" || true)
	if [ "$(kv "$out" total)" = "$limit" ]; then
		pass "limits file naming the GPU by UUID ($uuid): cuMemGetInfo total is its limit"
	else
		fail "limits file naming the GPU by UUID ($uuid): got '$out' $(head -c 400 "$work/uuid.log")"
	fi
	out=$(infile "CUDA_DEVICE_MEMORY_LIMIT_0=${limit_mib}m
GPUPACK_DEVICE_UUID_0=GPU-00000000-0000-0000-0000-000000000000
" "$gc" refuse 64 2>"$work/uuid.log" || true)
	if grep -q "is none of the GPUs in the limits file" "$work/uuid.log" && { [ -z "$out" ] || [ "$(kv "$out" rc)" = 2 ]; }; then
		pass "a GPU whose UUID is not in the limits file gets no memory (context or 64 MiB refused, one log line)"
	else
		fail "a GPU whose UUID is not in the limits file: $out $(head -c 400 "$work/uuid.log")"
	fi
else
	skip "limits file in a mount namespace not possible here ($(head -c 200 "$work/uuid.log")): UUID map not checked"
fi

# ---- PyTorch (runtime API), when present ------------------------------------
if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
	cat >"$work/torch_check.py" <<'EOF'
import sys
import torch
limit = int(sys.argv[1]) << 20
free, total = torch.cuda.mem_get_info()
ok = total == limit
try:
    x = torch.empty(limit + (1 << 30), dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    ok = False
except torch.cuda.OutOfMemoryError:
    pass
torch.cuda.empty_cache()
y = torch.empty(limit // 2, dtype=torch.uint8, device="cuda")
y.fill_(1)
torch.cuda.synchronize()
print(f"total={total} ok={int(ok)}")
sys.exit(0 if ok else 1)
EOF
	for conf in "" "expandable_segments:True"; do
		if PYTORCH_CUDA_ALLOC_CONF="$conf" hooked python3 "$work/torch_check.py" "$limit_mib"; then
			pass "PyTorch ${conf:-default allocator}: total = limit, limit+1 GiB refused, half the limit allocated"
		else
			fail "PyTorch ${conf:-default allocator} under a $limit_mib MiB limit"
		fi
	done
else
	skip "PyTorch with CUDA is not installed: runtime-API checks not run"
fi

echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
