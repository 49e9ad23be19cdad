#!/usr/bin/env bash
# The integer kernels' tests on smaller CPUs than this one, under qemu user-mode emulation:
#   scripts/qemu_cpu_classes.sh [MODEL...]      (default: Haswell Nehalem; qemu-x86_64 -cpu help lists more)
# Haswell: AVX2 + FMA + F16C, no AVX-512 (the avx2 form must be chosen); Nehalem: no AVX at all (the
# torch reference must serve, and no AVX code may run: the emulator raises SIGILL on any, as the canary
# below shows). Per model it prints what the CPU reports by cpuid, the form the execution plan chooses,
# then runs TESTS under it and prints pass/fail, the test counts and the wall time; the exit status
# is nonzero where any class failed. Needs `apt-get install -y qemu-user` and g++ (the canary).
# TESTS overrides the subset (default below; emulation runs ~20-50x slower than native), K a -k filter.
# The extension is built natively first (same TORCH_EXTENSIONS_DIR): compiling under emulation is slow.
# Subprocesses (ninja, g++) are not emulated: qemu-user runs only this Python.
set -uo pipefail
cd "$(dirname "$0")/.."
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$PWD/.torch_extensions}
py=.venv/bin/python
tests=${TESTS:-tests/test_cpu_qdot.py tests/test_plan.py}
models=("$@"); [ ${#models[@]} -gt 0 ] || models=(Haswell Nehalem)
command -v qemu-x86_64 >/dev/null || { echo "qemu-x86_64 missing: apt-get install -y qemu-user"; exit 2; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
quiet() { grep -v "TCG doesn't support requested feature"; }  # qemu's notes on flags it does not emulate

# What the plan picks, for a w8a layer, on the CPU that runs this (the probe is fed on stdin).
cat > "$tmp/probe.py" <<'EOF'
import torch
from torch import nn
from engine.kernels import cpu_qdot
from engine.platform import capabilities
from engine.quant.w8a import Int8W8ALinear
from engine.runtime.plan import make_plan
caps = capabilities.detect()
model = nn.Sequential(Int8W8ALinear.from_linear(nn.Linear(64, 32, bias=False)))
plan = make_plan(model, device="cpu", weights="int8w8a")
print(f"cpuid: {' '.join(caps.isa) or '(none of the ISA flags)'} · level {caps.isa_level} · torch {caps.torch_cpu_capability}")
print(f"forms this CPU runs: {' '.join(sorted(cpu_qdot.cpu_isas())) or 'none'}")
d = plan.decision("w8a kernel form")
print(f"plan: w8a_form {plan.w8a_form} ({d.choice}: {d.source})")
EOF
# Canaries: an AVX2 and an AVX-512 instruction, each must die (SIGILL) on a CPU model without it.
printf 'int main(){__asm__ volatile("vpaddd %%ymm0,%%ymm0,%%ymm0");return 0;}\n' > "$tmp/avx2.c"
printf 'int main(){__asm__ volatile("vpaddd %%zmm0,%%zmm0,%%zmm0");return 0;}\n' > "$tmp/avx512.c"
g++ -x c -O0 -o "$tmp/avx2" "$tmp/avx2.c" && g++ -x c -O0 -o "$tmp/avx512" "$tmp/avx512.c" || exit 2

echo "== native: build the extension ($TORCH_EXTENSIONS_DIR)"
$py -c "from engine.kernels import cpu_gemm; print('extension:', cpu_gemm.built_reason() or 'built and checked')"
$py - < "$tmp/probe.py"

status=0; summary=()
for m in "${models[@]}"; do
  echo "== qemu-x86_64 -cpu $m"
  canary=""
  for c in avx2 avx512; do
    (qemu-x86_64 -cpu "$m" "$tmp/$c"; exit $?) 2>/dev/null && canary+="$c runs " || canary+="$c SIGILL "
  done
  echo "canary: $canary"
  qemu-x86_64 -cpu "$m" $py - < "$tmp/probe.py" 2>&1 | quiet | tee "$tmp/form"
  start=$(date +%s)
  # pytest.ini's 600 s timeout is a native figure: one bundled-model test took 323 s emulated on busy cores
  qemu-x86_64 -cpu "$m" $py -m pytest $tests -p no:cacheprovider -o timeout=1800 ${K:+-k "$K"} 2>&1 | quiet > "$tmp/log"
  rc=${PIPESTATUS[0]}; wall=$(( $(date +%s) - start ))
  tail -n 25 "$tmp/log"
  counts=$(grep -E "^(=+ )?[0-9]+ (passed|failed|skipped|error)" "$tmp/log" | tail -1 | tr -d '=' | xargs)
  form=$(sed -n 's/^plan: w8a_form \([^ ]*\).*/\1/p' "$tmp/form")
  [ "$rc" -eq 0 ] && verdict=PASS || { verdict="FAIL (rc $rc)"; status=1; }
  summary+=("$(printf '%-10s %-14s form %-16s %5ss  %s · canary: %s' "$m" "$verdict" "${form:-?}" "$wall" "${counts:-no counts}" "$canary")")
done
echo "== summary (tests: $tests${K:+, -k \"$K\"})"
printf '%s\n' "${summary[@]}"
exit $status
