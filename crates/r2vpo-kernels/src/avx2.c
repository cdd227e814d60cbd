// f32 products on AVX2 + FMA, `y = A · B` with A (m, k) and B (k, n) each
// row- or column-major: the forward's many-row `x · wᵀ` and the layers'
// gradients `g · w` and `gᵀ · x` on CPUs with AVX2 but neither AVX-512 nor
// AMX (`avx2.rs` says when, and what it was measured at). Below, "x" is A
// and "weight" is B, as in the forward.
//
// GotoBLAS's blocking around BLIS's 6 × 16 Haswell register tile: each
// thread packs 288 weight rows at a time into 16-column panels and runs
// every six rows of x against them, so those six rows (a 6 × k panel)
// stay in L1 while the weight block streams from L2. A row-major x is read
// where it lies (`kernel_rows`); a transposed one (the weight gradient's
// gᵀ), or one swept by very many weight blocks (the LM head), is packed
// once per call into 6-row panels per k block (`r2vpo_avx2_pack_a`, split
// over rows) for `kernel`.
//
// Row independence: every output is one chain of FMAs over k in order, its
// partial sum parked in y between k blocks (exact in f32), k blocks depend
// only on k, and rows and columns past the edges are zero-padded in the
// packed copies (a last panel of x read in place is copied into a
// zero-padded one). Packed or read in place, the FMAs are the same. So an element's bits do not depend on the rows or columns
// beside it, on m, or on the column split. The chunked LM head (scoring
// equals training bit for bit) and the served log-probs (the learner's
// recomputation of a padded batch to 1e-5) rely on this; OpenBLAS's
// kernels do not give it.
//
// Why assembly for the inner loop: written with intrinsics, gcc 12 kept
// only some of the 12 accumulators in registers, reloaded w from memory
// for each FMA and moved accumulators between registers (perf annotate),
// and the kernel ran 43-66 GFLOP/s on one core against OpenBLAS's 70-78; with
// the loop in asm (15 of the 16 ymm registers: 12 sums, 2 of w, 1 of x) it
// ran level with OpenBLAS
// (results/bench/kernel-ab/avx2-forward-kernel-vs-openblas-2026-11-26), and
// runs the forward's shapes in 0.93-0.96x that time since it reads and
// writes y in place and prefetches x only
// (results/bench/kernel-ab/avx2-kernel-y-in-place-2026-11-27).
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

#define T __attribute__((target("avx2,fma")))
#define MR 6
#define NR 16
// Longest k block: a 6 × 768 x panel (18 KiB) stays in L1 beside the
// weights' 16 × 768 panel streaming through it.
#define KC_MAX 768
// Weight rows packed at a time: 288 × 768 × 4 B = 864 KiB at the longest k
// block, 648 KiB at k = 576 (L2 is 512 KiB on Zen 3; 96, 192, 288 and 384
// were measured, 288 ran best over SmolLM2's shapes).
#define NC 288

// k block length: ceil(k / KC_MAX) equal blocks (the last may be shorter).
// Depends on k alone, so each output's summation order does too.
static size_t kblock(size_t k) {
    size_t nb = (k + KC_MAX - 1) / KC_MAX;
    return (k + nb - 1) / nb;
}

// The 8 × 8 transpose of r[0..8] in place: r[q] becomes (r₀[q], …, r₇[q]).
T static inline void transpose8(__m256 r[8]) {
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
    r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
    r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// A's 6-row panels [r0, r1) into ap, for every k block: block `pc` (its
// first k) starts at ap + pc · mp, panel r within it at r · 6 · kc, and
// holds A[6r + i][pc + kk] at kk · 6 + i (zero for rows past m). A (m, k)
// is a[i · lda + p], or a[p · lda + i] when `at` (a transposed operand:
// the weight gradient's gᵀ).
// Row-major A: eight k steps at a time by an 8 × 8 transpose (two zero
// rows), the scalar copy for the rest: packing was 3.5 % of a scoring pass
// (perf) element by element. Transposed A: each k step's six values lie
// side by side, one load and one store.
T void r2vpo_avx2_pack_a(const float *a, size_t lda, int at, size_t m, size_t k, size_t r0, size_t r1, float *ap) {
    size_t kb = kblock(k), mp = (m + MR - 1) / MR * MR;
    const __m256i six = _mm256_setr_epi32(-1, -1, -1, -1, -1, -1, 0, 0);
    for (size_t pc = 0; pc < k; pc += kb) {
        size_t kc = k - pc < kb ? k - pc : kb;
        for (size_t r = r0; r < r1; r++) {
            float *panel = ap + pc * mp + r * MR * kc;
            if (at) {
                size_t rows = m - r * MR < MR ? m - r * MR : MR;
                const float *src = a + pc * lda + r * MR;
                // Eight lanes read where the row has them (two ignored),
                // the real ones only at its end; eight written, six kept
                // (the next step's store overwrites two, the last writes six).
                int wide = r * MR + 8 <= m;
                __m256i in = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
                __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)rows), in);
                for (size_t kk = 0; kk < kc; kk++) {
                    const float *s = src + kk * lda;
                    __m256 v = wide ? _mm256_loadu_ps(s) : _mm256_maskload_ps(s, mask);
                    if (kk + 1 < kc)
                        _mm256_storeu_ps(panel + kk * MR, v);
                    else
                        _mm256_maskstore_ps(panel + kk * MR, six, v);
                }
                continue;
            }
            const float *src[MR];
            for (size_t i = 0; i < MR; i++) {
                src[i] = r * MR + i < m ? a + (r * MR + i) * lda + pc : NULL;
            }
            size_t kk = 0;
            for (; kk + 8 <= kc; kk += 8) {
                __m256 v[8];
                for (size_t i = 0; i < MR; i++) v[i] = src[i] ? _mm256_loadu_ps(src[i] + kk) : _mm256_setzero_ps();
                v[6] = v[7] = _mm256_setzero_ps();
                transpose8(v);
                float *dst = panel + kk * MR;
                // Eight lanes written, six kept: each store's last two are
                // overwritten by the next; the last store writes six.
                for (int q = 0; q < 7; q++) _mm256_storeu_ps(dst + q * MR, v[q]);
                _mm256_maskstore_ps(dst + 7 * MR, six, v[7]);
            }
            for (; kk < kc; kk++)
                for (size_t i = 0; i < MR; i++) panel[kk * MR + i] = src[i] ? src[i][kk] : 0.0f;
        }
    }
}

// Columns [j0, j0 + ncp) × k block [p0, p0 + kc) of B (k, n) as 16-column
// panels: panel c holds B[p0 + kk][j0 + 16c + j] at kk · 16 + j (zero past
// n). B is b[j · ldb + p] when `bt` (the forward's wᵀ: weight rows as
// stored), else b[p · ldb + j] (the input gradient's w).
// Transposed B: eight k steps of eight columns at a time by an 8 × 8
// transpose. Row-major B: each k step's sixteen values lie side by side.
T static void pack_b(const float *b, size_t ldb, int bt, size_t n, size_t j0, size_t ncp, size_t p0, size_t kc,
                     float *bp) {
    for (size_t c = 0; c < ncp; c += NR) {
        if (!bt) {
            size_t cols = j0 + c >= n ? 0 : n - j0 - c < NR ? n - j0 - c : NR;
            const float *src = b + p0 * ldb + j0 + c;
            for (size_t kk = 0; kk < kc; kk++) {
                float *dst = bp + kk * NR;
                if (cols == NR) {
                    _mm256_store_ps(dst, _mm256_loadu_ps(src + kk * ldb));
                    _mm256_store_ps(dst + 8, _mm256_loadu_ps(src + kk * ldb + 8));
                } else {
                    for (size_t j = 0; j < NR; j++) dst[j] = j < cols ? src[kk * ldb + j] : 0.0f;
                }
            }
            bp += kc * NR;
            continue;
        }
        for (size_t h = 0; h < NR; h += 8) {
            const float *src[8];
            for (size_t j = 0; j < 8; j++) src[j] = j0 + c + h + j < n ? b + (j0 + c + h + j) * ldb + p0 : NULL;
            size_t kk = 0;
            for (; kk + 8 <= kc; kk += 8) {
                __m256 v[8];
                for (size_t j = 0; j < 8; j++) v[j] = src[j] ? _mm256_loadu_ps(src[j] + kk) : _mm256_setzero_ps();
                transpose8(v);
                for (size_t q = 0; q < 8; q++) _mm256_store_ps(bp + (kk + q) * NR + h, v[q]);
            }
            for (; kk < kc; kk++)
                for (size_t j = 0; j < 8; j++) bp[kk * NR + h + j] = src[j] ? src[j][kk] : 0.0f;
        }
        bp += kc * NR;
    }
}

// One k step `o` of the 6 × 16 tile: two vectors of w, six broadcasts of x
// (from the addresses X0-X5 of rows 0-5's value), twelve FMAs into
// ymm0-ymm11 (row i in ymm(2i), ymm(2i+1)).
#define TILE_STEP(o, X0, X1, X2, X3, X4, X5)                                                                           \
    "vmovaps " #o "*64(%[b]), %%ymm12\n\t"                                                                             \
    "vmovaps " #o "*64+32(%[b]), %%ymm13\n\t"                                                                          \
    "vbroadcastss " X0 ", %%ymm14\n\t"                                                                                 \
    "vfmadd231ps %%ymm12, %%ymm14, %%ymm0\n\t"                                                                         \
    "vfmadd231ps %%ymm13, %%ymm14, %%ymm1\n\t"                                                                         \
    "vbroadcastss " X1 ", %%ymm15\n\t"                                                                                 \
    "vfmadd231ps %%ymm12, %%ymm15, %%ymm2\n\t"                                                                         \
    "vfmadd231ps %%ymm13, %%ymm15, %%ymm3\n\t"                                                                         \
    "vbroadcastss " X2 ", %%ymm14\n\t"                                                                                 \
    "vfmadd231ps %%ymm12, %%ymm14, %%ymm4\n\t"                                                                         \
    "vfmadd231ps %%ymm13, %%ymm14, %%ymm5\n\t"                                                                         \
    "vbroadcastss " X3 ", %%ymm15\n\t"                                                                                 \
    "vfmadd231ps %%ymm12, %%ymm15, %%ymm6\n\t"                                                                         \
    "vfmadd231ps %%ymm13, %%ymm15, %%ymm7\n\t"                                                                         \
    "vbroadcastss " X4 ", %%ymm14\n\t"                                                                                 \
    "vfmadd231ps %%ymm12, %%ymm14, %%ymm8\n\t"                                                                         \
    "vfmadd231ps %%ymm13, %%ymm14, %%ymm9\n\t"                                                                         \
    "vbroadcastss " X5 ", %%ymm15\n\t"                                                                                 \
    "vfmadd231ps %%ymm12, %%ymm15, %%ymm10\n\t"                                                                        \
    "vfmadd231ps %%ymm13, %%ymm15, %%ymm11\n\t"

// x from a packed panel: step o's six values side by side at a.
#define STEP(o)                                                                                                        \
    TILE_STEP(o, #o "*24+0(%[a])", #o "*24+4(%[a])", #o "*24+8(%[a])", #o "*24+12(%[a])", #o "*24+16(%[a])",         \
              #o "*24+20(%[a])")

// x read in place: six rows at a0, a0 + lda, a0 + 2·lda, a3 = a0 + 3·lda,
// a3 + lda, a3 + 2·lda.
#define STEP_ROWS(o)                                                                                                   \
    TILE_STEP(o, #o "*4(%[a0])", #o "*4(%[a0],%[la],1)", #o "*4(%[a0],%[la],2)", #o "*4(%[a3])",                      \
              #o "*4(%[a3],%[la],1)", #o "*4(%[a3],%[la],2)")

// The k loop: four steps at a time (after PRE, then ADV4 moves x on by
// four), then one at a time (ADV1), w moving on 64 floats or 16.
#define K_LOOP(PRE, STEPM, ADV4, ADV1)                                                                                 \
    "test %[k4], %[k4]\n\t"                                                                                            \
    "jz 2f\n\t"                                                                                                        \
    "1:\n\t" PRE STEPM(0) STEPM(1) STEPM(2) STEPM(3) ADV4 "add $256, %[b]\n\t"                                         \
    "dec %[k4]\n\t"                                                                                                    \
    "jnz 1b\n\t"                                                                                                       \
    "2:\n\t"                                                                                                           \
    "test %[k1], %[k1]\n\t"                                                                                            \
    "jz 4f\n\t"                                                                                                        \
    "3:\n\t" STEPM(0) ADV1 "add $64, %[b]\n\t"                                                                         \
    "dec %[k1]\n\t"                                                                                                    \
    "jnz 3b\n\t"                                                                                                       \
    "4:\n\t"

// The tile's sums: zeroed (`first`) or loaded from y; stored back to y.
#define LOAD_OR_ZERO_Y                                                                                                 \
    "test %[first], %[first]\n\t"                                                                                      \
    "jz 5f\n\t"                                                                                                        \
    "vxorps %%ymm0, %%ymm0, %%ymm0\n\t"                                                                                \
    "vxorps %%ymm1, %%ymm1, %%ymm1\n\t"                                                                                \
    "vxorps %%ymm2, %%ymm2, %%ymm2\n\t"                                                                                \
    "vxorps %%ymm3, %%ymm3, %%ymm3\n\t"                                                                                \
    "vxorps %%ymm4, %%ymm4, %%ymm4\n\t"                                                                                \
    "vxorps %%ymm5, %%ymm5, %%ymm5\n\t"                                                                                \
    "vxorps %%ymm6, %%ymm6, %%ymm6\n\t"                                                                                \
    "vxorps %%ymm7, %%ymm7, %%ymm7\n\t"                                                                                \
    "vxorps %%ymm8, %%ymm8, %%ymm8\n\t"                                                                                \
    "vxorps %%ymm9, %%ymm9, %%ymm9\n\t"                                                                                \
    "vxorps %%ymm10, %%ymm10, %%ymm10\n\t"                                                                             \
    "vxorps %%ymm11, %%ymm11, %%ymm11\n\t"                                                                             \
    "jmp 6f\n\t"                                                                                                       \
    "5:\n\t"                                                                                                           \
    "vmovups (%[c]), %%ymm0\n\t"                                                                                       \
    "vmovups 32(%[c]), %%ymm1\n\t"                                                                                     \
    "vmovups (%[c],%[l],1), %%ymm2\n\t"                                                                                \
    "vmovups 32(%[c],%[l],1), %%ymm3\n\t"                                                                              \
    "vmovups (%[c],%[l],2), %%ymm4\n\t"                                                                                \
    "vmovups 32(%[c],%[l],2), %%ymm5\n\t"                                                                              \
    "vmovups (%[c3]), %%ymm6\n\t"                                                                                      \
    "vmovups 32(%[c3]), %%ymm7\n\t"                                                                                    \
    "vmovups (%[c3],%[l],1), %%ymm8\n\t"                                                                               \
    "vmovups 32(%[c3],%[l],1), %%ymm9\n\t"                                                                             \
    "vmovups (%[c3],%[l],2), %%ymm10\n\t"                                                                              \
    "vmovups 32(%[c3],%[l],2), %%ymm11\n\t"                                                                            \
    "6:\n\t"

#define STORE_Y                                                                                                        \
    "vmovups %%ymm0, (%[c])\n\t"                                                                                       \
    "vmovups %%ymm1, 32(%[c])\n\t"                                                                                     \
    "vmovups %%ymm2, (%[c],%[l],1)\n\t"                                                                                \
    "vmovups %%ymm3, 32(%[c],%[l],1)\n\t"                                                                              \
    "vmovups %%ymm4, (%[c],%[l],2)\n\t"                                                                                \
    "vmovups %%ymm5, 32(%[c],%[l],2)\n\t"                                                                              \
    "vmovups %%ymm6, (%[c3])\n\t"                                                                                      \
    "vmovups %%ymm7, 32(%[c3])\n\t"                                                                                    \
    "vmovups %%ymm8, (%[c3],%[l],1)\n\t"                                                                               \
    "vmovups %%ymm9, 32(%[c3],%[l],1)\n\t"                                                                             \
    "vmovups %%ymm10, (%[c3],%[l],2)\n\t"                                                                              \
    "vmovups %%ymm11, 32(%[c3],%[l],2)\n\t"                                                                            \
    "vzeroupper\n\t"

// The 6 × 16 block of y at y (row stride ldy) += the x panel · the w panel
// over kc steps (from zero when `first`), each sum one FMA chain in k
// order. y is read and written in place: copying it through an aligned
// buffer around the loop cost 3-5 % (forward shapes, paired runs in one
// process, `results/bench/kernel-ab/avx2-kernel-y-in-place-2026-11-27/`).
T static void kernel(size_t kc, const float *ap, const float *bp, float *y, size_t ldy, int first) {
    size_t k4 = kc / 4, k1 = kc % 4, l = ldy * sizeof(float);
    float *y3 = y + 3 * ldy;
    __asm__ volatile(
        LOAD_OR_ZERO_Y
        // Only x is prefetched: software prefetches of the weight panel
        // (which streams in order, and the hardware prefetcher follows it)
        // cost 3-5 % (paired runs, kernel-ab/avx2-kernel-y-in-place-2026-11-27).
        K_LOOP("prefetcht0 384(%[a])\n\t", STEP, "add $96, %[a]\n\t", "add $24, %[a]\n\t")
        STORE_Y
        : [a] "+r"(ap), [b] "+r"(bp), [k4] "+r"(k4), [k1] "+r"(k1)
        : [c] "r"(y), [c3] "r"(y3), [l] "r"(l), [first] "r"((size_t)first)
        : "memory", "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
          "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
}

// kernel() with x's six rows read where they lie (row stride lda) instead
// of from a packed panel.
T static void kernel_rows(size_t kc, const float *a, size_t lda, const float *bp, float *y, size_t ldy, int first) {
    size_t k4 = kc / 4, k1 = kc % 4, l = ldy * sizeof(float), la = lda * sizeof(float);
    float *y3 = y + 3 * ldy;
    const float *a3 = a + 3 * lda;
    __asm__ volatile(
        LOAD_OR_ZERO_Y
        // No software prefetch: six row prefetches per four k steps cost
        // 2.5 % over the forward's shapes (paired runs,
        // kernel-ab/avx2-kernel-x-in-place-2026-11-27).
        K_LOOP("", STEP_ROWS, "add $16, %[a0]\n\t" "add $16, %[a3]\n\t", "add $4, %[a0]\n\t" "add $4, %[a3]\n\t")
        STORE_Y
        : [a0] "+r"(a), [a3] "+r"(a3), [b] "+r"(bp), [k4] "+r"(k4), [k1] "+r"(k1)
        : [c] "r"(y), [c3] "r"(y3), [l] "r"(l), [la] "r"(la), [first] "r"((size_t)first)
        : "memory", "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
          "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
}

// The 6 × 16 tile at y (row stride ldy) over one k block, x's panel
// packed at `a` (lda 0) or its six rows read in place (row stride lda):
// rows < rows and columns < cols are real; `first` starts the sums at
// zero, otherwise at y's parked partial sums. `next` (or NULL) is the tile
// after this one, whose y rows are prefetched. A tile on the edges runs
// through a 6 × 16 buffer.
T static void tile(size_t kc, const float *a, size_t lda, const float *bp, float *y, size_t ldy, size_t rows,
                   size_t cols, int first, const float *next) {
    if (next)
        for (int i = 0; i < MR; i++) {
            _mm_prefetch((const char *)(next + i * ldy), _MM_HINT_T0);
            _mm_prefetch((const char *)(next + i * ldy + NR - 1), _MM_HINT_T0);
        }
    float acc[MR * NR] __attribute__((aligned(32)));
    int edge = rows != MR || cols != NR;
    // On the first k block the kernel zeroes its sums itself and writes
    // the whole buffer; after it, the buffer starts from y's parked sums
    // (zero past the edges).
    if (edge && !first) {
        memset(acc, 0, sizeof acc);
        for (size_t i = 0; i < rows; i++) memcpy(acc + i * NR, y + i * ldy, cols * sizeof(float));
    }
    float *c = edge ? acc : y;
    size_t ldc = edge ? NR : ldy;
    if (lda)
        kernel_rows(kc, a, lda, bp, c, ldc, first);
    else
        kernel(kc, a, bp, c, ldc, first);
    if (edge)
        for (size_t i = 0; i < rows; i++) memcpy(y + i * ldy, acc + i * NR, cols * sizeof(float));
}

// Columns [c0, c1) of y (m, n; row stride ldy) = A · B (+= when `acc`: the
// sums start from y), B as pack_b reads it, A either packed by
// r2vpo_avx2_pack_a (`ap`; a transposed A) or, where `ap` is NULL,
// row-major at `a` with row stride lda, read in place: packing a row-major
// x was 3.3 % of a scoring pass and 3.4 % of a training step (perf), and
// the kernel reads six rows as fast as one packed panel. A last panel of
// fewer than six rows is copied into a zero-padded one. Returns 0, or -1
// when a buffer could not be allocated (nothing written then).
T int r2vpo_avx2_cols(const float *ap, const float *a, size_t lda, size_t m, size_t k, const float *b, size_t ldb,
                      int bt, size_t n, size_t c0, size_t c1, float *y, size_t ldy, int acc) {
    size_t kb = kblock(k), mp = (m + MR - 1) / MR * MR;
    float *bp = aligned_alloc(64, NC * kb * sizeof(float));
    float *ep = !ap && m % MR ? malloc(MR * kb * sizeof(float)) : NULL;
    if (!bp || (!ap && m % MR && !ep)) {
        free(bp);
        free(ep);
        return -1;
    }
    for (size_t jc = c0; jc < c1; jc += NC) {
        size_t nc = c1 - jc < NC ? c1 - jc : NC, ncp = (nc + NR - 1) / NR * NR;
        for (size_t pc = 0; pc < k; pc += kb) {
            size_t kc = k - pc < kb ? k - pc : kb;
            pack_b(b, ldb, bt, n, jc, ncp, pc, kc, bp);
            for (size_t ir = 0; ir < m; ir += MR) {
                size_t rows = m - ir < MR ? m - ir : MR;
                const float *panel = ap ? ap + pc * mp + ir * kc : a + ir * lda + pc;
                size_t ld = ap ? 0 : lda;
                if (!ap && rows < MR) {
                    for (size_t i = 0; i < rows; i++) memcpy(ep + i * kc, a + (ir + i) * lda + pc, kc * sizeof(float));
                    memset(ep + rows * kc, 0, (MR - rows) * kc * sizeof(float));
                    panel = ep;
                    ld = kc;
                }
                for (size_t jr = 0; jr < ncp; jr += NR) {
                    size_t col = jc + jr;
                    if (col >= c1) break;
                    size_t cols = c1 - col < NR ? c1 - col : NR;
                    const float *next = col + NR < c1 && jr + NR < ncp ? y + ir * ldy + col + NR
                                        : ir + MR < m                  ? y + (ir + MR) * ldy + jc
                                                                       : NULL;
                    tile(kc, panel, ld, bp + jr * kc, y + ir * ldy + col, ldy, rows, cols, pc == 0 && !acc, next);
                }
            }
        }
    }
    free(bp);
    free(ep);
    return 0;
}

// y (m, n; row stride ldy) = A · B (+= when `acc`) on the calling thread,
// A and B as r2vpo_avx2_pack_a and pack_b read them: the attention's small
// products, one (row, kv head) per thread. A row-major A is read in place.
// Returns 0, or -1 when a buffer could not be allocated (nothing written
// then).
T int r2vpo_avx2_product_here(const float *a, size_t lda, int at, const float *b, size_t ldb, int bt, size_t m,
                              size_t k, size_t n, float *y, size_t ldy, int acc) {
    if (!at) return r2vpo_avx2_cols(NULL, a, lda, m, k, b, ldb, bt, n, 0, n, y, ldy, acc);
    size_t mp = (m + MR - 1) / MR * MR;
    float *ap = aligned_alloc(64, (mp * k * sizeof(float) + 63) / 64 * 64);
    if (!ap) return -1;
    r2vpo_avx2_pack_a(a, lda, at, m, k, 0, mp / MR, ap);
    int rc = r2vpo_avx2_cols(ap, NULL, 0, m, k, b, ldb, bt, n, 0, n, y, ldy, acc);
    free(ap);
    return rc;
}
#endif
