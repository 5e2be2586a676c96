// mma.cuh - the pieces cuda_attention's tensor-core kernels share (the
// prefill kernel in prefill.cu, the packed verification kernel in
// packed.cuh): mma.sync m16n8k16 with bf16 inputs and f32 sums, f32 values
// carried as two bf16 halves, and where a key's row lies in a paged view.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 with .bf16): g = lane / 4,
// t = lane % 4. A (16x16, row-major): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..),
// a2 = (g, 2t+8..), a3 = (g+8, 2t+8..). B (16x8, k x n): b0 = (k 2t..2t+1,
// n g), b1 = (k 2t+8.., n g). C (16x8 f32): c0,c1 = (g, 2t..2t+1),
// c2,c3 = (g+8, 2t..). The low 16 bits of a register hold the element of
// lower index.
#ifndef CUDA_ATTN_MMA_CUH
#define CUDA_ATTN_MMA_CUH

#include <cuda_bf16.h>
#include <stdint.h>

namespace cuda_attn {

// c += a * b (16x16 by 16x8).
__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(__nv_bfloat16 lo_index, __nv_bfloat16 hi_index) {
    return (uint32_t)__bfloat16_as_ushort(lo_index) | ((uint32_t)__bfloat16_as_ushort(hi_index) << 16);
}

// The pair (x, y) as hi and lo bf16 halves (hi = bf16(x), lo = bf16(x -
// hi): 16 significant bits together), each packed x in the low 16 bits.
__device__ __forceinline__ void split_pair(float x, float y, uint32_t *hi, uint32_t *lo) {
    const __nv_bfloat16 hx = __float2bfloat16_rn(x), hy = __float2bfloat16_rn(y);
    *hi = pack_bf16(hx, hy);
    *lo = pack_bf16(__float2bfloat16_rn(x - __bfloat162float(hx)), __float2bfloat16_rn(y - __bfloat162float(hy)));
}

// A paged view's block table (PAGED instances only): key t's row starts at
// table[t / bs] * bstride + (t % bs) * ts elements.
struct Pages {
    const int32_t *table;
    int bs;
    int64_t bstride;
};

// Where key t's row starts (elements, before the head offset).
template <bool PAGED> __device__ __forceinline__ int64_t key_row(int t, int64_t ts, const Pages &pg) {
    if constexpr (PAGED) return (int64_t)pg.table[t / pg.bs] * pg.bstride + (int64_t)(t % pg.bs) * ts;
    else return (int64_t)t * ts;
}

} // namespace cuda_attn

#endif // CUDA_ATTN_MMA_CUH
