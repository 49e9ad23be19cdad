// How our CPU kernels stream weights and cache rows from memory: as they read a row, they also ask for
// the bytes kAhead further on, into L2 (prefetcht1), so that each core keeps more of its misses in flight
// than the hardware prefetchers start on their own (they begin again at every 4 KB page, and a decode
// step's products are short streams, 0.1-0.5 MB a thread). A row of many-row work already in L2 costs
// one instruction a line. Plain C++ with static functions (no torch, nothing shared between files
// compiled with different ISA flags): included by the row kernels of every ISA, the fp32 panels and
// the decode attention.
//
// Why 4 KB into L2, not less, nearer or non-temporal: the alternatives were timed on an Intel Xeon with the
// distance read from a variable, each alternating with the others in one process, and lost or gained less
// (docs/streams-2026-12-06.md). Before and after, two checkouts taking turns:
// `python -m engine.bench --threads 2 --dtype fp32 bandwidth --context 256 --variants int4w8a+head8` in each.
// The one exception is the plan's (engine/runtime/plan.py w8a_hardware_stream): on an AMD Zen 4 the 4-bit row
// kernels ran faster leaving their weights to the hardware's prefetchers (cpu_qdot.h Args::fetch false;
// `python -m engine.bench quant_steps --prefetch` times both there, docs/quantization-w8a-2026-12-07.md).
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace stream {

constexpr int64_t kAhead = 4096;  // bytes: how far ahead of the read a row's lines are asked for
constexpr int64_t kLine = 64;

// The lines of [p, p + bytes) asked for into L2. No fault: a prefetch past the end of a buffer is dropped.
static inline __attribute__((always_inline)) void fetch(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t b = 0; b < bytes; b += kLine) _mm_prefetch(c + b, _MM_HINT_T1);
}

// The row at `row` (`bytes` long) being read: the same span kAhead further on asked for.
static inline __attribute__((always_inline)) void ahead(const void* row, int64_t bytes) {
  fetch(static_cast<const char*>(row) + kAhead, bytes);
}

}  // namespace stream
