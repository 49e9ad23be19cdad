"""Our C++ CPU kernels (GEMM, weight-only products, decode attention, the layer loop) and their build."""
