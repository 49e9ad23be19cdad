// How a product's output channels are shared among the threads: the one tile scheduler of the CPU
// kernels (cpu_gemm.cpp's fp32 panels and weight-only kernels, cpu_qdot.cpp's integer kernels, the decode
// attention's runs of chunks).
//
// Each thread owns a contiguous run of the tiles and takes them from its front, in address order, so that it
// reads its share of the weights as one stream that the hardware's prefetchers follow from tile to tile; a
// thread whose run is done takes the last tile left in another's (from its back). So on a shared machine (a
// server's own event loop, a neighbour's job) a thread that loses its core for a while does not hold the
// whole call back: the others take its tiles. Which thread computes a tile never changes its bits. Tiles
// handed out from one shared counter instead (thread 0 tile 0, thread 1 tile 1, thread 0 tile 2, ...) made
// every thread jump between tiles, and a step slower where kernels leave their stream to the hardware's
// prefetchers (the 4-bit ones on an AMD Zen 4: cpu_stream.h). Measured in one process, both ways in turn,
// and the 4-bit step's GB/s against the fp32 step's before and after (`python -m engine.bench --threads 2
// --dtype fp32 bandwidth --variants int4w8a+head8`): docs/quantization-w8a-2026-12-07.md, "Tiles in address
// order".
//
// Tile size: a product of many rows passes over its weights once per block of rows, so a tile is small
// enough to stay in L2 across the blocks (the caller's `many`). A product of one block (a decode step)
// reuses nothing: a thread's weights are best read as few long runs, kShares tiles a thread. Small
// tiles made each thread's stream restart thousands of times a step (64-channel tiles: ~3,200 an
// int4w8a+head8 step), each restart with cold misses; two tiles a thread ran that step in 0.79x the
// time (2 threads, AMD EPYC Zen 4, context 256; one tile a thread 0.77x, but then a thread that loses
// its core holds the step back): `python -m engine.bench bandwidth` shows it,
// docs/quantization-w8a-2026-12-05.md.
#pragma once
#include <ATen/Parallel.h>

#include <c10/util/FunctionRef.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>

namespace tiles {

constexpr int64_t kShares = 2;  // one row block: tiles a thread

// Units (output channels, or panels of them) a tile: `many` where the rows come in several blocks, else
// kShares tiles a thread, at least `least` units.
inline int64_t size(int64_t units, bool one_block, int64_t many, int64_t least) {
  if (!one_block) return many;
  const int64_t parts = kShares * at::get_num_threads();
  return std::max(least, (units + parts - 1) / parts);
}

// tile(t) for every t in [0, count), each exactly once: what each thread of a parallel call runs (tiles::run
// below, and Team's leader and helpers in cpu_tiles.cpp). init() gives thread i of n the run [i count / n,
// (i + 1) count / n); take(i) runs thread i's from the front, then what is left of the others' from the back.
// A run's front and back share one word, so a tile is claimed by one compare-and-swap whoever takes it.
class Runs {
 public:
  void init(int64_t count, int64_t threads) {
    n_ = static_cast<int>(std::clamp<int64_t>(threads, 1, kMax));
    for (int i = 0; i < n_; ++i)
      runs_[i].word.store(pack(count * i / n_, count * (i + 1) / n_), std::memory_order_relaxed);
  }
  template <typename Tile>
  void take(int64_t thread, Tile&& tile) {
    const int own = static_cast<int>(thread % n_);
    for (int64_t t; (t = claim(runs_[own], true)) >= 0;) tile(t);
    for (int k = 1; k < n_; ++k)
      for (int64_t t; (t = claim(runs_[(own + k) % n_], false)) >= 0;) tile(t);
  }

 private:
  static constexpr int kMax = 64;  // runs at most; more threads share them (a claim is atomic either way)
  struct alignas(64) Run {  // a line each: the threads claim at once
    std::atomic<uint64_t> word{0};  // front (low half), back (high half): the run's unclaimed tiles [front, back)
  };
  static uint64_t pack(int64_t front, int64_t back) {
    return static_cast<uint64_t>(front) | static_cast<uint64_t>(back) << 32;
  }
  // The front tile (or the back one) of r, claimed; -1 where none is left.
  static int64_t claim(Run& r, bool front) {
    uint64_t w = r.word.load(std::memory_order_relaxed);
    for (;;) {
      const int64_t f = static_cast<int64_t>(w & 0xffffffffu), b = static_cast<int64_t>(w >> 32);
      if (f >= b) return -1;
      if (r.word.compare_exchange_weak(w, front ? pack(f + 1, b) : pack(f, b - 1), std::memory_order_acq_rel,
                                       std::memory_order_relaxed))
        return front ? f : b - 1;
    }
  }
  Run runs_[kMax];
  int n_ = 1;
};

// One OpenMP team held for a whole call (cpu_layers.cpp: a decode step's layer loop), so that its many
// small parallel calls do not each open and close a parallel region (0.67 us a region, 2 threads, AMD EPYC
// Zen 4: ~0.1 ms of an int4w8a+head8 step's 151; docs/quantization-w8a-2026-12-05.md). The caller's thread
// leads: it runs `body` alone, and every run() it makes there (tiles::run below) is served by the team's
// other threads, which wait spinning between calls, as OpenMP's own do between regions. Which thread
// computes a tile still never changes its bits.
class Team {
 public:
  // body() on the calling thread with `threads` (at most; fewer where OpenMP gives fewer) serving its
  // run() calls; an exception body throws is rethrown here after the team has stopped.
  static void lead(int threads, c10::function_ref<void()> body);
  static Team* current();  // the team the calling thread leads, or null
  void run(int64_t count, c10::function_ref<void(int64_t)> tile);

 private:
  static constexpr uint64_t kStop = ~uint64_t{0};
  void serve(int thread);
  alignas(64) std::atomic<uint64_t> posted_{0};  // the latest call's number; kStop: the body returned
  Runs runs_;                                    // the current call's tiles
  alignas(64) std::atomic<int> done_{0};         // helpers finished with the current call
  c10::function_ref<void(int64_t)>* tile_ = nullptr;
  uint64_t calls_ = 0;
  int helpers_ = 0;
};

// tile(t) for t in [0, count), each exactly once, by whichever thread takes it.
template <typename Tile>
void run(int64_t count, Tile&& tile) {
  if (Team* team = Team::current()) return team->run(count, tile);
  const int64_t threads = std::min<int64_t>(count, at::get_num_threads());
  Runs runs;
  runs.init(count, threads);
  at::parallel_for(0, threads, 1, [&](int64_t first, int64_t last) {  // one index a thread (more where fewer run)
    for (int64_t i = first; i < last; ++i) runs.take(i, tile);
  });
}

}  // namespace tiles
