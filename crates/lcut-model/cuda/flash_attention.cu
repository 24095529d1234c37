// lcut's fused attention for the CUDA path: one pass over the keys each
// query reads, scores and probabilities kept in shared memory a tile at a
// time (online softmax), tensor-core products (WMMA, bf16 or f16 inputs,
// f32 accumulation), no score matrix and no mask tensor in global memory.
//
// A block holds one K/V head and BR = 64 of its rows; row r of K/V head g
// is query head g * group + r / n at query r % n, so the query heads that
// share a K/V head read each key tile once (a decode step's heads fill the
// rows of one tile). Which keys a query reads comes from the key planner as
// spans: `reads` holds the offsets [n + 1] of each query's spans, then the
// spans as (start, end) pairs of key indices, ascending. A block skips the
// key tiles outside the union of its rows' spans (the causal triangle, a
// window), and masks inside a tile by the spans.
//
// With `splits` > 1 the block's key tiles are split over gridDim.z (flash
// decoding): each split writes its unnormalised output, running maximum and
// sum, and `lcut_flash_combine_*` merges them. Sinks (gpt-oss) join the
// denominator at the end; Gemma's soft cap is applied to the scaled score.
//
// Key and value tiles arrive by asynchronous copies (cp.async), the next
// tile's while this one is used. Each warp owns 16 rows and keeps its
// queries in registers; two lanes share a row for the softmax. The tile
// sizes and the shared-memory layout are mirrored in the host's launcher
// (`decoder::flash`) and the arithmetic in lcut-kernels' CPU twin
// (`attention::tiled`), which CI tests.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>
#include <stdint.h>

using namespace nvcuda;

#define BR 64
#define WARPS 4
#define THREADS 128

template <typename T> __device__ __forceinline__ float to_float(T x);
template <> __device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <> __device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ __nv_bfloat16 from_float(float x) { return __float2bfloat16(x); }
template <> __device__ __forceinline__ __half from_float(float x) { return __float2half(x); }

// Whether `key` lies in one of the spans [a, b) of `spans`.
__device__ __forceinline__ bool reads_key(const uint32_t* spans, uint32_t a, uint32_t b, uint32_t key) {
    for (uint32_t s = a; s < b; ++s) {
        if (key >= spans[2 * s] && key < spans[2 * s + 1]) return true;
    }
    return false;
}

// 16 bytes from global to shared memory without passing through registers
// (zeros when `valid` is false: nothing is read from `src` then).
__device__ __forceinline__ void copy16_async(void* dst, const void* src, bool valid) {
    const unsigned at = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    const int bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(at), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Wait until at most one committed group of copies is still in flight.
__device__ __forceinline__ void async_wait_all_but_one() { asm volatile("cp.async.wait_group 1;\n" ::); }

// Starts copying key (or value) tile `t` of K/V head `kvh` into `dst`
// ([BC rows][HD], rows padded to LD); rows past `keys` are zeros.
template <typename T, int HD, int BC, int LD>
__device__ __forceinline__ void load_tile_async(T* dst, const T* src, long long head_stride,
                                                long long row_stride, int kvh, int t, int keys) {
    constexpr int VEC = 8;
    const T* base = src + kvh * head_stride;
    for (int idx = threadIdx.x; idx < BC * (HD / VEC); idx += THREADS) {
        const int r = idx / (HD / VEC), c = (idx % (HD / VEC)) * VEC;
        const int key = t * BC + r;
        const bool valid = key < keys;
        copy16_async(dst + r * LD + c, valid ? base + key * row_stride + c : base, valid);
    }
    async_commit();
}

template <typename T, int HD>
__device__ __forceinline__ void flash_body(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
    T* __restrict__ out, float* __restrict__ lse, float* __restrict__ part_o,
    float* __restrict__ part_ml, const uint32_t* __restrict__ reads,
    const float* __restrict__ sinks, int n, int keys, int group,
    long long k_head_stride, long long k_row_stride, long long v_head_stride,
    long long v_row_stride, float scale, float softcap, int has_sinks, int splits) {
    constexpr int BC = HD <= 128 ? 64 : 32;
    constexpr int LDQ = HD + 8, LDK = HD + 8, LDS = BC + 4, LDP = BC + 8, LDO = HD + 4;
    constexpr int VEC = 8;  // 16-bit elements per 16-byte load
    constexpr int HALF = BC / 2;
    extern __shared__ __align__(128) unsigned char smem[];
    T* sQ = reinterpret_cast<T*>(smem);
    T* sK = sQ + BR * LDQ;
    T* sV = sK + BC * LDK;
    float* sS = reinterpret_cast<float*>(sV + BC * LDK);
    T* sP = reinterpret_cast<T*>(sS + WARPS * 16 * LDS);
    float* sO = reinterpret_cast<float*>(sP + WARPS * 16 * LDP);
    __shared__ int range_lo, range_hi;

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int kvh = blockIdx.y, split = blockIdx.z;
    const int heads = gridDim.y * group;
    const int rows = group * n;
    const int row0 = blockIdx.x * BR;
    const uint32_t* offsets = reads;
    const uint32_t* spans = reads + n + 1;

    if (tid == 0) {
        range_lo = 0x7fffffff;
        range_hi = 0;
    }
    __syncthreads();
    for (int idx = tid; idx < BR * (HD / VEC); idx += THREADS) {
        const int r = idx / (HD / VEC), c = (idx % (HD / VEC)) * VEC;
        const int gr = row0 + r;
        uint4 val = make_uint4(0, 0, 0, 0);
        if (gr < rows) {
            const int head = kvh * group + gr / n, i = gr % n;
            val = *reinterpret_cast<const uint4*>(q + ((long long)head * n + i) * HD + c);
        }
        *reinterpret_cast<uint4*>(sQ + r * LDQ + c) = val;
    }
    if (tid < BR && row0 + tid < rows) {
        const int i = (row0 + tid) % n;
        const uint32_t a = offsets[i], b = offsets[i + 1];
        if (b > a) {
            atomicMin(&range_lo, (int)spans[2 * a]);
            atomicMax(&range_hi, (int)spans[2 * (b - 1) + 1]);
        }
    }
    __syncthreads();
    int t_lo = range_lo / BC, t_hi = (range_hi + BC - 1) / BC;
    if (range_hi <= range_lo) t_lo = t_hi = 0;
    const int per_split = (t_hi - t_lo + splits - 1) / splits;
    const int t_begin = t_lo + split * per_split;
    const int t_end = min(t_hi, t_begin + per_split);

    const int wrow0 = warp * 16;
    const bool warp_active = row0 + wrow0 < rows;
    float* sSw = sS + warp * 16 * LDS;
    T* sPw = sP + warp * 16 * LDP;
    float* sOw = sO + warp * 16 * LDO;
    const int rr = lane >> 1, half = lane & 1;
    const int gr = row0 + wrow0 + rr;
    const bool row_valid = gr < rows;
    const int qi = row_valid ? gr % n : 0;
    const uint32_t span_a = row_valid ? offsets[qi] : 0, span_b = row_valid ? offsets[qi + 1] : 0;
    float m = -INFINITY, l = 0.f;
    for (int c = half * (HD / 2); c < (half + 1) * (HD / 2); ++c) sOw[rr * LDO + c] = 0.f;
    // the warp's queries stay in registers for every key tile
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> qf[HD / 16];
    if (warp_active) {
#pragma unroll
        for (int kk = 0; kk < HD / 16; ++kk) wmma::load_matrix_sync(qf[kk], sQ + wrow0 * LDQ + kk * 16, LDQ);
    }

    // Keys and values arrive by asynchronous copies, one tile ahead: the
    // next key tile loads while this tile's softmax and value product run,
    // the next value tile while the next scores run.
    if (t_begin < t_end) {
        load_tile_async<T, HD, BC, LDK>(sK, k, k_head_stride, k_row_stride, kvh, t_begin, keys);
        load_tile_async<T, HD, BC, LDK>(sV, v, v_head_stride, v_row_stride, kvh, t_begin, keys);
    }
    for (int t = t_begin; t < t_end; ++t) {
        const int k0 = t * BC;
        const bool more = t + 1 < t_end;
        async_wait_all_but_one();  // key tile t is in
        __syncthreads();
        if (warp_active) {
            // S = Q K^T for the warp's 16 rows
#pragma unroll
            for (int nb = 0; nb < BC / 16; ++nb) {
                wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
                wmma::fill_fragment(acc, 0.f);
#pragma unroll
                for (int kk = 0; kk < HD / 16; ++kk) {
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> b;
                    wmma::load_matrix_sync(b, sK + nb * 16 * LDK + kk * 16, LDK);
                    wmma::mma_sync(acc, qf[kk], b, acc);
                }
                wmma::store_matrix_sync(sSw + nb * 16, acc, LDS, wmma::mem_row_major);
            }
        }
        __syncthreads();  // every warp is done with the key tile
        if (more) {
            load_tile_async<T, HD, BC, LDK>(sK, k, k_head_stride, k_row_stride, kvh, t + 1, keys);
        } else {
            async_commit();
        }
        async_wait_all_but_one();  // value tile t is in
        __syncthreads();
        if (warp_active) {
            // online softmax: lane (rr, half) takes row rr, columns half * HALF..
            float s_local[HALF];
            float mx = -INFINITY;
#pragma unroll
            for (int c = 0; c < HALF; ++c) {
                const int col = half * HALF + c, key = k0 + col;
                float s = -INFINITY;
                if (row_valid && key < keys && reads_key(spans, span_a, span_b, key)) {
                    s = sSw[rr * LDS + col] * scale;
                    if (softcap > 0.f) s = softcap * tanhf(s / softcap);
                }
                s_local[c] = s;
                mx = fmaxf(mx, s);
            }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
            const float m_new = fmaxf(m, mx);
            const float alpha = m_new == -INFINITY ? 1.f : __expf(m - m_new);
            float sum = 0.f;
#pragma unroll
            for (int c = 0; c < HALF; ++c) {
                const float p = s_local[c] == -INFINITY ? 0.f : __expf(s_local[c] - m_new);
                sPw[rr * LDP + half * HALF + c] = from_float<T>(p);
                sum += p;
            }
            sum += __shfl_xor_sync(0xffffffff, sum, 1);
            l = l * alpha + sum;
            m = m_new;
            for (int c = half * (HD / 2); c < (half + 1) * (HD / 2); ++c) sOw[rr * LDO + c] *= alpha;
            __syncwarp();
            // O += P V
#pragma unroll
            for (int ob = 0; ob < HD / 16; ++ob) {
                wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
                wmma::load_matrix_sync(acc, sOw + ob * 16, LDO, wmma::mem_row_major);
#pragma unroll
                for (int kk = 0; kk < BC / 16; ++kk) {
                    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> b;
                    wmma::load_matrix_sync(a, sPw + kk * 16, LDP);
                    wmma::load_matrix_sync(b, sV + kk * 16 * LDK + ob * 16, LDK);
                    wmma::mma_sync(acc, a, b, acc);
                }
                wmma::store_matrix_sync(sOw + ob * 16, acc, LDO, wmma::mem_row_major);
            }
            __syncwarp();
        }
        __syncthreads();  // every warp is done with the value tile
        if (more) {
            load_tile_async<T, HD, BC, LDK>(sV, v, v_head_stride, v_row_stride, kvh, t + 1, keys);
        } else {
            async_commit();
        }
    }
    __syncwarp();
    if (!row_valid) return;
    const int head = kvh * group + gr / n;
    const long long orow = (long long)head * n + qi;
    if (splits == 1) {
        float total = l, weight = 1.f, top = m;
        if (has_sinks) {
            const float s = sinks[head];
            top = fmaxf(m, s);
            weight = m == -INFINITY ? 0.f : __expf(m - top);
            total = l * weight + __expf(s - top);
        }
        const float inv = weight / total;
        for (int c = half * (HD / 2); c < (half + 1) * (HD / 2); ++c)
            out[orow * HD + c] = from_float<T>(sOw[rr * LDO + c] * inv);
        if (half == 0) lse[orow] = top + logf(total);
    } else {
        const long long prow = (long long)split * heads * n + orow;
        for (int c = half * (HD / 2); c < (half + 1) * (HD / 2); ++c)
            part_o[prow * HD + c] = sOw[rr * LDO + c];
        if (half == 0) {
            part_ml[2 * prow] = m;
            part_ml[2 * prow + 1] = l;
        }
    }
}

// Merges the splits of row blockIdx.x (of heads * n): each split's output
// weighted by exp(its maximum - the largest), over the summed denominators
// (and the sink's share).
template <typename T>
__device__ __forceinline__ void combine_body(
    const float* __restrict__ part_o, const float* __restrict__ part_ml,
    const float* __restrict__ sinks, T* __restrict__ out, float* __restrict__ lse,
    int n, int hd, int rows_total, int splits, int has_sinks) {
    const int row = blockIdx.x;
    float top = -INFINITY;
    for (int s = 0; s < splits; ++s) top = fmaxf(top, part_ml[2 * ((long long)s * rows_total + row)]);
    float sink = -INFINITY;
    if (has_sinks) {
        sink = sinks[row / n];
        top = fmaxf(top, sink);
    }
    float total = has_sinks ? __expf(sink - top) : 0.f;
    for (int s = 0; s < splits; ++s) {
        const long long p = (long long)s * rows_total + row;
        const float ms = part_ml[2 * p];
        if (ms != -INFINITY) total += part_ml[2 * p + 1] * __expf(ms - top);
    }
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc = 0.f;
        for (int s = 0; s < splits; ++s) {
            const long long p = (long long)s * rows_total + row;
            const float ms = part_ml[2 * p];
            if (ms != -INFINITY) acc += part_o[p * hd + d] * __expf(ms - top);
        }
        out[(long long)row * hd + d] = from_float<T>(acc / total);
    }
    if (threadIdx.x == 0) lse[row] = top + logf(total);
}

#define FLASH_ARGS                                                                             \
    const T* q, const T* k, const T* v, T* out, float* lse, float* part_o, float* part_ml,     \
        const uint32_t* reads, const float* sinks, int n, int keys, int group,                 \
        long long k_head_stride, long long k_row_stride, long long v_head_stride,              \
        long long v_row_stride, float scale, float softcap, int has_sinks, int splits
#define FLASH_CALL                                                                             \
    q, k, v, out, lse, part_o, part_ml, reads, sinks, n, keys, group, k_head_stride,           \
        k_row_stride, v_head_stride, v_row_stride, scale, softcap, has_sinks, splits

#define FLASH_KERNEL(NAME, HD)                                                                \
    extern "C" __global__ void __launch_bounds__(THREADS)                                     \
        lcut_flash_##NAME##_##HD(FLASH_ARGS) { flash_body<T, HD>(FLASH_CALL); }

// Every head dim of the host's `tiled::HEAD_DIMS`, and the merge, for the
// 16-bit type T (defined around each use).
#define FLASH_KERNELS(NAME)                                                                   \
    FLASH_KERNEL(NAME, 16)                                                                    \
    FLASH_KERNEL(NAME, 32)                                                                    \
    FLASH_KERNEL(NAME, 64)                                                                    \
    FLASH_KERNEL(NAME, 80)                                                                    \
    FLASH_KERNEL(NAME, 96)                                                                    \
    FLASH_KERNEL(NAME, 128)                                                                   \
    FLASH_KERNEL(NAME, 256)                                                                   \
    extern "C" __global__ void lcut_flash_combine_##NAME(                                     \
        const float* part_o, const float* part_ml, const float* sinks, T* out, float* lse,    \
        int n, int hd, int rows_total, int splits, int has_sinks) {                           \
        combine_body<T>(part_o, part_ml, sinks, out, lse, n, hd, rows_total, splits,          \
                        has_sinks);                                                           \
    }

#define T __nv_bfloat16
FLASH_KERNELS(bf16)
#undef T
#define T __half
FLASH_KERNELS(f16)
#undef T
