// What lets one piece of arithmetic serve both devices: OPBRIDGE_HD marks a function that the CPU kernels call
// and the CUDA kernels (cpp/cuda/) call from device code. Outside nvcc it is empty, so the CPU build and the ORT
// library see plain inline C++, and the CPU tests keep covering the arithmetic the GPU runs.
#pragma once

#if defined(__CUDACC__)
#define OPBRIDGE_HD __host__ __device__
#else
#define OPBRIDGE_HD
#endif

// OPBRIDGE_HD, always inlined: a per-element function on a hot path of both devices.
#if defined(__CUDACC__)
#define OPBRIDGE_HD_INLINE __host__ __device__ __forceinline__
#else
#define OPBRIDGE_HD_INLINE [[gnu::always_inline]] inline
#endif
