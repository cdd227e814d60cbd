// f32 products on Intel AMX: `y = x · wᵀ` with x (m, k) and w (n, k)
// row-major f32, each operand split into three bf16 pieces (x = x0 + x1 + x2,
// exact for normal f32 values) and the six products whose order is at most
// 2⁻¹⁶ below the leading one summed in f32 by TDPBF16PS:
//   x0·w0 + x0·w1 + x0·w2 + x1·w0 + x1·w1 + x2·w0.
// A bf16 × bf16 product is exact in f32 and the tiles accumulate in f32, so
// the result is an f32 dot product of six times the terms; the three dropped
// products are below 2⁻²⁴ of the leading one (f32's own rounding).
//
// Why C and not Rust: Rust's AMX intrinsics are unstable (nightly only) and
// no crate multiplies f32 on AMX; gcc's intrinsics are stable. See
// `amx.rs` for what it measured and how it is dispatched.
//
// Many rows (`r2vpo_amx_linear_cols`): x's pieces are the A tiles (16 rows
// × 32 k, as x lies); w's pieces are the B tiles in the VNNI layout
// TDPBF16PS wants (16 k pairs × 16 output columns), split and transposed
// once per call, 32 columns at a time. Few rows (`r2vpo_amx_small_cols`,
// below): the roles turned around, so w is split as it streams past.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#define AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,prfchw")))

// 1 when this CPU has AMX-TILE, AMX-BF16 and AVX512_BF16 and the kernel grants this
// process the tile data state; 0 otherwise (then nothing here may run).
int r2vpo_amx_init(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    int bf16 = (d >> 22) & 1, tile = (d >> 24) & 1, avx512f = (b >> 16) & 1, avx512bw = (b >> 30) & 1;
    if (!(bf16 && tile && avx512f && avx512bw)) return 0;
    // AVX512_BF16 (VCVTNE2PS2BF16, the few-row kernel's packing): every CPU
    // with AMX has it, but it has its own CPUID bit.
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d) || !((a >> 5) & 1)) return 0;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

// The three bf16 pieces of 16 values, as bits in the low halves of 32-bit
// lanes: p0 = bf16(v), p1 = bf16(v − p0), p2 = bf16(v − p0 − p1), each
// rounded to nearest even by integer arithmetic (DAZ-free, unlike
// VCVTNEPS2BF16). Exact (v = p0 + p1 + p2) for normal v; values within
// 2⁻⁸ of f32's largest round p0 to infinity (products then give NaN).
AMX_TARGET static inline void split3_16(__m512 v, __m512i *h0, __m512i *h1, __m512i *h2) {
    const __m512i bias = _mm512_set1_epi32(0x7FFF), one = _mm512_set1_epi32(1), hi = _mm512_set1_epi32((int)0xFFFF0000u);
#define RNE(u) _mm512_and_si512(_mm512_add_epi32(_mm512_add_epi32(u, bias), _mm512_and_si512(_mm512_srli_epi32(u, 16), one)), hi)
    __m512i u0 = RNE(_mm512_castps_si512(v));
    __m512 r1 = _mm512_sub_ps(v, _mm512_castsi512_ps(u0));
    __m512i u1 = RNE(_mm512_castps_si512(r1));
    __m512 r2 = _mm512_sub_ps(r1, _mm512_castsi512_ps(u1));
    __m512i u2 = RNE(_mm512_castps_si512(r2));
#undef RNE
    *h0 = _mm512_srli_epi32(u0, 16);
    *h1 = _mm512_srli_epi32(u1, 16);
    *h2 = _mm512_srli_epi32(u2, 16);
}

// 32 consecutive values, zero past `len`, as two vectors of 16.
AMX_TARGET static inline void load32(const float *src, size_t len, __m512 *lo, __m512 *hi) {
    __mmask16 m0 = len >= 16 ? 0xFFFF : (__mmask16)((1u << len) - 1);
    __mmask16 m1 = len >= 32 ? 0xFFFF : len <= 16 ? 0 : (__mmask16)((1u << (len - 16)) - 1);
    *lo = _mm512_maskz_loadu_ps(m0, src);
    *hi = _mm512_maskz_loadu_ps(m1, src + 16);
}

// 32 consecutive values (zero past `len`) as three 32-lane bf16 vectors,
// one per piece, in order: lane j of piece p is value j's piece p.
AMX_TARGET static inline void split3_32(const float *src, size_t len, __m512i out[3]) {
    __m512 lo, hi;
    load32(src, len, &lo, &hi);
    __m512i a[3], b[3];
    split3_16(lo, &a[0], &a[1], &a[2]);
    split3_16(hi, &b[0], &b[1], &b[2]);
    for (int p = 0; p < 3; p++)
        out[p] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(a[p])), _mm512_cvtepi32_epi16(b[p]), 1);
}

// The values 4 k blocks ahead in a row, into L1: the splits read 16 or
// 32 rows 128 bytes at a time, more streams than the hardware prefetcher
// follows (SmolLM2's head, 49 152 × 576, split in 39 ms instead of 56 on
// one thread).
AMX_TARGET static inline void prefetch_ahead(const float *row, size_t kb, size_t k) {
    if ((kb + 4) * 32 < k) {
        _mm_prefetch((const char *)(row + (kb + 4) * 32), _MM_HINT_T0);
        _mm_prefetch((const char *)(row + (kb + 4) * 32 + 16), _MM_HINT_T0);
    }
}

// Per-thread scratch that grows and is kept: fresh pages for every call
// cost more than a small product's arithmetic.
static __thread void *scratch_ptr;
static __thread size_t scratch_len;
static void *scratch(size_t bytes) {
    if (bytes > scratch_len) {
        free(scratch_ptr);
        scratch_ptr = aligned_alloc(64, (bytes + 63) / 64 * 64);
        scratch_len = scratch_ptr ? bytes : 0;
    }
    return scratch_ptr;
}

// Tile layout of a split operand: 32 rows (or columns) at a time, then k
// blocks of 32, then pieces, then halves of 16: each A or B tile is 1 KB
// contiguous, and one 32-row block's k block (3 pieces × 2 halves) is 6 KB
// contiguous, so the kernel reads both operands as plain streams.
static inline size_t tile_at(size_t blk32, size_t kb, size_t p, size_t h, size_t kb_n) {
    return (((blk32 * kb_n + kb) * 3 + p) * 2 + h) * 512;
}

// Rows [r0, r1) of x (m, k; row stride ldx), r0 a multiple of 32, into xp
// in the tile layout above (A tiles: row r of a tile is x's row, 32 k).
// Rows past m up to the next multiple of 32 are zero.
AMX_TARGET void r2vpo_amx_split_rows(const float *x, size_t ldx, size_t m, size_t k, size_t r0, size_t r1,
                                     uint16_t *xp, size_t kp) {
    size_t kb_n = kp / 32;
    __m512i pc[3];
    // A 32-row block's k block (6 tiles, 6 KB) is written in one sweep.
    for (size_t blk = r0 / 32; blk < (r1 + 31) / 32; blk++)
        for (size_t kb = 0; kb < kb_n; kb++)
            for (size_t r = 0; r < 32; r++) {
                size_t i = blk * 32 + r;
                const float *row = x + i * ldx;
                size_t len = i < m && kb * 32 < k ? k - kb * 32 : 0;
                if (i < m) prefetch_ahead(row, kb, k);
                split3_32(row + kb * 32, len, pc);
                for (size_t p = 0; p < 3; p++)
                    _mm512_storeu_si512(xp + tile_at(blk, kb, p, r / 16, kb_n) + (r % 16) * 32, pc[p]);
            }
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tilecfg;

// All eight tiles as 16 rows × 64 bytes (f32 accumulators and bf16 pairs
// alike), for this thread; each kernel releases them when done.
AMX_TARGET static void configure_tiles(void) {
    tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    _tile_loadconfig(&cfg);
}

// r[i] lane j → r[j] lane i, for 16 × 16 32-bit lanes (the usual four
// rounds of unpacks and 128-bit shuffles).
AMX_TARGET static inline void transpose16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int i = 0; i < 16; i += 8)
        for (int j = 0; j < 4; j++) {
            t[i + j] = _mm512_shuffle_i32x4(r[i + j], r[i + j + 4], 0x88);
            t[i + j + 4] = _mm512_shuffle_i32x4(r[i + j], r[i + j + 4], 0xdd);
        }
    for (int j = 0; j < 8; j++) {
        r[j] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0x88);
        r[j + 8] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0xdd);
    }
}

// Columns [c0, c0 + 32) of w (n, k) as B tiles in the tile layout (block 0
// of `panel`): tile row r holds k pair r of each of 16 columns, as the
// VNNI layout of TDPBF16PS wants. Columns past n are zero. 16 columns' 32
// values of one k block, split, are 16 × 16 pairs per piece: transposed in
// registers, they are the tile's rows.
AMX_TARGET static void split_panel(const float *w, size_t ldw, size_t n, size_t k, size_t c0, size_t kb_n,
                                   uint16_t *panel) {
    __m512i pc[3], rows[3][16];
    for (size_t h = 0; h < 2; h++)
        for (size_t kb = 0; kb < kb_n; kb++) {
            for (size_t c = 0; c < 16; c++) {
                size_t col = c0 + h * 16 + c;
                size_t len = col < n && kb * 32 < k ? k - kb * 32 : 0;
                if (col < n) prefetch_ahead(w + col * ldw, kb, k);
                split3_32(w + col * ldw + kb * 32, len, pc);
                for (int q = 0; q < 3; q++) rows[q][c] = pc[q];
            }
            for (size_t q = 0; q < 3; q++) {
                transpose16(rows[q]);
                uint16_t *tile = panel + tile_at(0, kb, q, h, kb_n);
                for (int r = 0; r < 16; r++) _mm512_store_si512(tile + r * 32, rows[q][r]);
            }
        }
}

// Moves the 32 × 32 block in tiles 0–3 (rows m0, columns n0) into y
// through an L1 buffer, whose masked stores cut the block at y's edges.
AMX_TARGET static inline void store32(float *y, size_t ldy, size_t m, size_t n, size_t m0, size_t n0, float *buf) {
    _tile_stored(0, buf, 128);
    _tile_stored(1, buf + 16, 128);
    _tile_stored(2, buf + 16 * 32, 128);
    _tile_stored(3, buf + 16 * 32 + 16, 128);
    size_t rows = m - m0 < 32 ? m - m0 : 32, cols = n - n0 < 32 ? n - n0 : 32;
    __mmask16 lo = cols >= 16 ? 0xFFFF : (__mmask16)((1u << cols) - 1);
    __mmask16 hi = cols >= 32 ? 0xFFFF : cols <= 16 ? 0 : (__mmask16)((1u << (cols - 16)) - 1);
    for (size_t i = 0; i < rows; i++) {
        float *dst = y + (m0 + i) * ldy + n0;
        _mm512_mask_storeu_ps(dst, lo, _mm512_load_ps(buf + i * 32));
        _mm512_mask_storeu_ps(dst + 16, hi, _mm512_load_ps(buf + i * 32 + 16));
    }
}

// One piece product of a 32 × 32 block held in tiles 0–3: A's two 16-row
// halves in tiles 4 and 5, B's two halves in 6 and 7, then the next
// operands loaded (A_NEXT / B_NEXT: the piece at `a` / `b`, or −1 for none).
// Tiles are not renamed: a load into a tile waits for the products still
// reading it. So each column tile's two products go back to back and its
// next operand loads behind them, while the other column's products run.
// Used by `block32` and `r2vpo_amx_small_cols`, whose `a` and `b` are in scope.
#define STEP(A_NEXT, B_NEXT)                                   \
    _tile_dpbf16ps(0, 4, 6);                                   \
    _tile_dpbf16ps(2, 5, 6);                                   \
    if (B_NEXT >= 0) _tile_loadd(6, b + B_NEXT * 1024, 64);       \
    _tile_dpbf16ps(1, 4, 7);                                   \
    _tile_dpbf16ps(3, 5, 7);                                   \
    if (A_NEXT >= 0) {                                         \
        _tile_loadd(4, a + A_NEXT * 1024, 64);                    \
        _tile_loadd(5, a + A_NEXT * 1024 + 512, 64);              \
    }                                                          \
    if (B_NEXT >= 0) _tile_loadd(7, b + B_NEXT * 1024 + 512, 64);

// Adds to tiles 0–3 (a 32 × 32 block of y) the six piece products over
// all k blocks of a 32-row block `a` and a 32-column panel `b`, both in the
// tile layout.
AMX_TARGET static inline void block32(const uint16_t *a, const uint16_t *b, size_t kb_n, const float *y_next,
                                      size_t ldy, size_t y_rows) {
    // The next block's 32 rows of y, for writing, a few per k block: its
    // stores then find their lines in cache instead of waiting on misses
    // (SmolLM2's head, 320 × 49 152 × 576: 0.94× the time; the layers'
    // shapes within noise). Prefetching the next k block's tiles, the next
    // panel or the next row block's x pieces bought nothing.
    size_t per = (y_rows + kb_n - 1) / kb_n;
    for (size_t kb = 0; kb < kb_n; kb++, a += 3072, b += 3072) {
        for (size_t r = kb * per; r < (kb + 1) * per && r < y_rows; r++) {
            _m_prefetchw((void *)(y_next + r * ldy));
            _m_prefetchw((void *)(y_next + r * ldy + 16));
        }
        _tile_loadd(4, a, 64);
        _tile_loadd(5, a + 512, 64);
        _tile_loadd(6, b, 64);
        _tile_loadd(7, b + 512, 64);
        STEP(-1, 1)   // x0 · w0
        STEP(-1, 2)   // x0 · w1
        STEP(1, 0)    // x0 · w2
        STEP(-1, 1)   // x1 · w0
        STEP(2, 0)    // x1 · w1
        STEP(-1, -1)  // x2 · w0
    }
}

// Bytes of x's pieces one row block keeps in L2, and of w's split panels
// one column block keeps in L3. Splitting k into L1-sized chunks (partial
// sums parked in memory between them) and software prefetch of the next
// k block's tiles were both slower on SmolLM2's shapes.
#define A_BYTES (1u << 20)
#define B_BYTES (4u << 20)

// Columns [c0, c1) of y = x · wᵀ (c0 a multiple of 32; y's row stride ldy),
// with x already split by `r2vpo_amx_split_rows` (kp = k rounded up to 32).
// GotoBLAS's blocking: a column block of w's panels is split once, then
// every row block of x (L2-sized) meets all its panels. Returns 0, or -1
// when its scratch could not be allocated (nothing written then).
AMX_TARGET int r2vpo_amx_linear_cols(const uint16_t *xp, size_t m, size_t kp, const float *w, size_t ldw, size_t n,
                                     size_t k, size_t c0, size_t c1, float *y, size_t ldy) {
    size_t kb_n = kp / 32, blk_elems = kb_n * 3072, row_bytes = kp * 6;
    size_t mp = (m + 31) / 32 * 32;
    size_t mblk = A_BYTES / row_bytes / 32 * 32, nblk = B_BYTES / row_bytes / 32 * 32;
    if (mblk < 32) mblk = 32;
    if (nblk < 32) nblk = 32;
    uint16_t *panels = scratch((nblk / 32) * blk_elems * 2);
    float buf[1024] __attribute__((aligned(64)));
    if (!panels) return -1;
    configure_tiles();
    for (size_t nb = c0; nb < c1; nb += nblk) {
        size_t ne = nb + nblk < c1 ? nb + nblk : c1;
        for (size_t cb = nb; cb < ne; cb += 32) split_panel(w, ldw, n, k, cb, kb_n, panels + (cb - nb) / 32 * blk_elems);
        for (size_t mb0 = 0; mb0 < mp; mb0 += mblk) {
            size_t me = mb0 + mblk < mp ? mb0 + mblk : mp;
            for (size_t cb = nb; cb < ne; cb += 32) {
                const uint16_t *pan = panels + (cb - nb) / 32 * blk_elems;
                for (size_t mb = mb0; mb < me; mb += 32) {
                    _tile_zero(0);
                    _tile_zero(1);
                    _tile_zero(2);
                    _tile_zero(3);
                    // The block after this one: the next rows of this
                    // panel, else the first rows of the next panel (never
                    // another thread's columns: that would steal its lines).
                    size_t nm = mb + 32 < me ? mb + 32 : mb0, nc = mb + 32 < me ? cb : cb + 32;
                    size_t y_rows = nm < m && nc < ne ? (m - nm < 32 ? m - nm : 32) : 0;
                    block32(xp + mb / 32 * blk_elems, pan, kb_n, y + nm * ldy + nc, ldy, y_rows);
                    if (mb < m) store32(y, ldy, m, n, mb, cb, buf);
                }
            }
        }
    }
    _tile_release();
    return 0;
}

// ---------------------------------------------------------------- few rows

// The decode steps' products (m ≤ 32 rows) turned around: yᵀ = w · xᵀ, so
// the weight's pieces are the A tiles, which take rows as w lies (16 of its
// rows × 32 k): splitting a weight needs no transpose, only the split, and
// it is done in L1 as the rows stream past, so nothing is packed or kept.
// x's pieces are the B tiles (VNNI layout), split once per call.

// split3_32 by truncation: p0 = v's top 16 bits, p1 those of v − p0, p2 =
// v − p0 − p1 (at most 8 significant bits left, so a bf16 value), each
// exact, packed by VCVTNE2PS2BF16 (exact on bf16 values). A quarter of
// split3_32's instructions, which a decode step's weights, split on every
// call, cannot afford: the pieces are as exact, only up to twice as large
// below the leading one, so the three dropped products are too (still
// below f32's rounding of the sum; `amx.rs`'s tests bound the error).
// Denormal pieces (of values below 2⁻¹⁰²) are read as zero, as the tiles
// read them anyway.
AMX_TARGET __attribute__((target("avx512bf16"))) static inline void split3t_32(const float *src, size_t len,
                                                                                __m512i out[3]) {
    const __m512i hi = _mm512_set1_epi32((int)0xFFFF0000u);
    __m512 a, b;
    load32(src, len, &a, &b);
    __m512 a0 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(a), hi));
    __m512 b0 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(b), hi));
    __m512 ar = _mm512_sub_ps(a, a0), br = _mm512_sub_ps(b, b0);
    __m512 a1 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(ar), hi));
    __m512 b1 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(br), hi));
    __m512 a2 = _mm512_sub_ps(ar, a1), b2 = _mm512_sub_ps(br, b1);
    out[0] = (__m512i)_mm512_cvtne2ps_pbh(b0, a0);
    out[1] = (__m512i)_mm512_cvtne2ps_pbh(b1, a1);
    out[2] = (__m512i)_mm512_cvtne2ps_pbh(b2, a2);
}

// k blocks [kb0, kb1) of x (m ≤ 32, k; row stride k) as B tiles: for k block kb, piece p and
// 16-row half h, the 1 KB tile at ((kb · 3 + p) · halves + h) · 512, whose
// row r holds k pair r of each of the half's 16 rows. Rows past m and k
// past k are zero.
AMX_TARGET __attribute__((target("avx512bf16"))) void r2vpo_amx_small_split_x(const float *x, size_t m, size_t k,
                                                                              uint16_t *xb, size_t kb0, size_t kb1) {
    size_t halves = (m + 15) / 16;
    __m512i pc[3], rows[3][16];
    for (size_t kb = kb0; kb < kb1; kb++)
        for (size_t h = 0; h < halves; h++) {
            for (size_t i = 0; i < 16; i++) {
                size_t row = h * 16 + i;
                size_t len = row < m ? k - kb * 32 : 0;
                split3t_32(row < m ? x + row * k + kb * 32 : x, len, pc);
                for (int p = 0; p < 3; p++) rows[p][i] = pc[p];
            }
            for (size_t p = 0; p < 3; p++) {
                transpose16(rows[p]);
                uint16_t *tile = xb + ((kb * 3 + p) * halves + h) * 512;
                for (int r = 0; r < 16; r++) _mm512_storeu_si512(tile + r * 32, rows[p][r]);
            }
        }
}

// k block kb of weight rows [t0, t0 + 32) (zero past n and k) split into
// A tiles at `abuf`: piece p's 16-row half h at (p · 2 + h) · 512. Also
// prefetches, into L2, the values 8 k blocks ahead in the stream of blocks
// up to column c1: 32 rows read 128 bytes at a time are more streams than
// the hardware prefetcher follows. (2 threads, weights from memory: 4
// blocks ahead into L1 read them at 15–17 GB/s, 8 into L2 at 17–19; this
// machine's plain streaming read is 24–25 GB/s.)
AMX_TARGET __attribute__((target("avx512bf16"))) static inline void split_rows32(const float *w, size_t n, size_t k,
                                                                                  size_t kb_n, size_t c1,
                                                                                  size_t t0, size_t kb, size_t r0,
                                                                                  size_t r1, uint16_t *abuf) {
    size_t ab = kb + 8, at = t0;
    while (ab >= kb_n) ab -= kb_n, at += 32;
    __m512i pc[3];
    for (size_t c = r0; c < r1; c++) {
        size_t col = t0 + c;
        if (at < c1 && at + c < n && ab * 32 < k) {
            const float *pf = w + (at + c) * k + ab * 32;
            _mm_prefetch((const char *)pf, _MM_HINT_T1);
            _mm_prefetch((const char *)(pf + 16), _MM_HINT_T1);
        }
        split3t_32(col < n ? w + col * k + kb * 32 : w, col < n ? k - kb * 32 : 0, pc);
        for (int p = 0; p < 3; p++) _mm512_store_si512(abuf + (p * 2 + c / 16) * 512 + (c % 16) * 32, pc[p]);
    }
}

// Columns [c0, c1) of y (m ≤ 32, n; row stride ldy) = x · wᵀ, c0 a
// multiple of 32, with x split by `r2vpo_amx_small_split_x`. For each 32
// weight rows, each k block's 32 × 32 values are split into A tiles in an
// L1 buffer (piece, then 16-row half: the layout `block32` reads) and meet
// x's pieces at once; the 32 × m block of yᵀ is transposed in registers on
// the way out.
AMX_TARGET __attribute__((target("avx512bf16"))) void r2vpo_amx_small_cols(const uint16_t *xb, size_t m, size_t kp,
                                                                           const float *w, size_t n, size_t k,
                                                                           size_t c0, size_t c1, float *y,
                                                                           size_t ldy) {
    size_t kb_n = kp / 32, halves = (m + 15) / 16;
    uint16_t abuf[2][3072] __attribute__((aligned(64)));
    float buf[256] __attribute__((aligned(64)));
    configure_tiles();
    // The first 8 k blocks, which no earlier block prefetched (batch-32
    // decode, alternating pairs: 568 / 597 / 596 tokens/s without, 615 /
    // 608 / 594 with; a small gain, kept since it costs nothing).
    for (size_t kb = 0; kb < kb_n && kb < 8; kb++)
        for (size_t c = 0; c < 32 && c0 + c < n; c++) {
            const float *pf = w + (c0 + c) * k + kb * 32;
            _mm_prefetch((const char *)pf, _MM_HINT_T1);
            if (kb * 32 + 16 < k) _mm_prefetch((const char *)(pf + 16), _MM_HINT_T1);
        }
    // One k block ahead: the next block is split (into the other buffer)
    // while this one multiplies, so that its stores have reached L1 by the
    // time the tiles load them (a tile load right behind the stores it
    // reads waits for them, and the tile unit with it: SmolLM2's decode
    // shapes at 32 rows ran at 212 GFLOP/s that way against 278 so, 2
    // threads, weights from memory).
    int cur = 0;
    split_rows32(w, n, k, kb_n, c1, c0, 0, 0, 32, abuf[cur]);
    for (size_t t0 = c0; t0 < c1; t0 += 32) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (size_t kb = 0; kb < kb_n; kb++) {
            // The next block, split a few rows between each group of
            // products: the split's vector instructions and the tile unit
            // then run side by side. Split whole and then multiplied, the
            // two took the sum of their times (a standalone test, 32 × 32
            // blocks in cache: 215 ns a block against 125–156 interleaved).
            size_t nt = kb + 1 < kb_n ? t0 : t0 + 32, nkb = kb + 1 < kb_n ? kb + 1 : 0;
            int more = nt < c1;
            uint16_t *next = abuf[cur ^ 1];
#define SPLIT(R0, R1) \
    if (more) split_rows32(w, n, k, kb_n, c1, nt, nkb, R0, R1, next);
            const uint16_t *a = abuf[cur], *b = xb + kb * 3 * halves * 512;
            if (halves == 2) {
                // As `block32`, the roles of x and w swapped.
                _tile_loadd(4, a, 64);
                _tile_loadd(5, a + 512, 64);
                _tile_loadd(6, b, 64);
                _tile_loadd(7, b + 512, 64);
                STEP(-1, 1)   // w0 · x0
                SPLIT(0, 6)
                STEP(-1, 2)   // w0 · x1
                SPLIT(6, 12)
                STEP(1, 0)    // w0 · x2
                SPLIT(12, 17)
                STEP(-1, 1)   // w1 · x0
                SPLIT(17, 22)
                STEP(2, 0)    // w1 · x1
                SPLIT(22, 27)
                STEP(-1, -1)  // w2 · x0
                SPLIT(27, 32)
            } else {
                // One half of x: tiles 0 and 2, in the same order; B
                // alternates between tiles 6 and 7 so that a load does not
                // wait for the products reading the other.
#define PAIR(A_NEXT, B_AT, T)                                  \
    if (A_NEXT >= 0) {                                         \
        _tile_loadd(4, a + A_NEXT * 1024, 64);                    \
        _tile_loadd(5, a + A_NEXT * 1024 + 512, 64);              \
    }                                                          \
    _tile_loadd(T, b + B_AT * 512, 64);                           \
    _tile_dpbf16ps(0, 4, T);                                   \
    _tile_dpbf16ps(2, 5, T);
                PAIR(0, 0, 6)   // w0 · x0
                SPLIT(0, 6)
                PAIR(-1, 1, 7)  // w0 · x1
                SPLIT(6, 12)
                PAIR(-1, 2, 6)  // w0 · x2
                SPLIT(12, 17)
                PAIR(1, 0, 7)   // w1 · x0
                SPLIT(17, 22)
                PAIR(-1, 1, 6)  // w1 · x1
                SPLIT(22, 27)
                PAIR(2, 0, 7)   // w2 · x0
                SPLIT(27, 32)
#undef PAIR
            }
#undef SPLIT
            cur ^= 1;
        }
        for (size_t q = 0; q < 4; q++) {
            // Tile q: weight rows t0 + 16·(q / 2), x rows 16·(q % 2).
            size_t r0 = t0 + 16 * (q / 2), h = q % 2;
            if (h >= halves || r0 >= n) continue;
            switch (q) {
            case 0: _tile_stored(0, buf, 64); break;
            case 1: _tile_stored(1, buf, 64); break;
            case 2: _tile_stored(2, buf, 64); break;
            default: _tile_stored(3, buf, 64); break;
            }
            size_t cols = n - r0 < 16 ? n - r0 : 16;
            __mmask16 mask = cols >= 16 ? 0xFFFF : (__mmask16)((1u << cols) - 1);
            __m512i r[16];
            for (int i = 0; i < 16; i++) r[i] = _mm512_load_si512(buf + i * 16);
            transpose16(r);
            for (size_t i = 0; i < 16 && h * 16 + i < m; i++)
                _mm512_mask_storeu_ps(y + (h * 16 + i) * ldy + r0, mask, _mm512_castsi512_ps(r[i]));
        }
    }
    _tile_release();
}
// ------------------------------------------------------ bf16 weights, any rows

// y (m, n; row stride ldy) = x · wᵀ for columns [c0, c1) (c0 a multiple of
// 32), w (n, k) in bf16 (bits), x split by `r2vpo_amx_small_split_x` (any
// m: its tiles come in 16-row halves). As `r2vpo_amx_small_cols` with the
// roles of x and w turned around, but a bf16 weight is its own single
// piece and already lies as A tiles want it (16 rows × 32 k): the tiles
// load straight from the matrix with its row stride, nothing is split or
// packed, and each k block takes three products (w · x0, w · x1, w · x2),
// an f32 product of x with the bf16 weights. The weight rows of one
// 32-row block (32 × k × 2 bytes: 36 KB for k = 576) stay in L1/L2 while
// every 32-row block of x meets them. Tiles at the edges (rows past n, k
// past k) are copied into a zero-padded L1 buffer first.
AMX_TARGET void r2vpo_amx_bf16w_cols(const uint16_t *xb, size_t m, size_t kp, const uint16_t *w, size_t n, size_t k,
                                     size_t c0, size_t c1, float *y, size_t ldy) {
    size_t kb_n = kp / 32, halves = (m + 15) / 16;
    uint16_t pad[2][512] __attribute__((aligned(64)));
    float buf[256] __attribute__((aligned(64)));
    configure_tiles();
    for (size_t t0 = c0; t0 < c1; t0 += 32) {
        for (size_t h0 = 0; h0 < halves; h0 += 2) {
            int two = h0 + 1 < halves;
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (size_t kb = 0; kb < kb_n; kb++) {
                if (h0 == 0) {
                    // The weight rows 8 k blocks ahead, into L2 (running on
                    // into the next 32 rows): 32 rows read 64 bytes at a time
                    // are more streams than the hardware prefetcher follows.
                    size_t ab = kb + 8, at = t0;
                    while (ab >= kb_n) ab -= kb_n, at += 32;
                    if (at < c1)
                        for (size_t r = 0; r < 32 && at + r < n; r++)
                            _mm_prefetch((const char *)(w + (at + r) * k + ab * 32), _MM_HINT_T1);
                }
                for (int s = 0; s < 2; s++) {
                    size_t r0 = t0 + 16 * (size_t)s;
                    if (r0 + 16 <= n && (kb + 1) * 32 <= k) {
                        if (s == 0) _tile_loadd(4, w + r0 * k + kb * 32, k * 2);
                        else _tile_loadd(5, w + r0 * k + kb * 32, k * 2);
                        continue;
                    }
                    memset(pad[s], 0, sizeof pad[s]);
                    size_t len = k - kb * 32 < 32 ? k - kb * 32 : 32;
                    for (size_t r = 0; r < 16 && r0 + r < n; r++)
                        memcpy(pad[s] + r * 32, w + (r0 + r) * k + kb * 32, len * 2);
                    if (s == 0) _tile_loadd(4, pad[0], 64);
                    else _tile_loadd(5, pad[1], 64);
                }
                for (size_t p = 0; p < 3; p++) {
                    const uint16_t *b = xb + ((kb * 3 + p) * halves + h0) * 512;
                    _tile_loadd(6, b, 64);
                    if (two) _tile_loadd(7, b + 512, 64);
                    _tile_dpbf16ps(0, 4, 6);
                    _tile_dpbf16ps(2, 5, 6);
                    if (two) {
                        _tile_dpbf16ps(1, 4, 7);
                        _tile_dpbf16ps(3, 5, 7);
                    }
                }
            }
            for (size_t q = 0; q < 4; q++) {
                // Tile q: weight rows t0 + 16·(q / 2), x rows 16·(h0 + q % 2).
                size_t r0 = t0 + 16 * (q / 2), h = h0 + q % 2;
                if (h >= halves || r0 >= n || r0 >= c1) continue;
                switch (q) {
                case 0: _tile_stored(0, buf, 64); break;
                case 1: _tile_stored(1, buf, 64); break;
                case 2: _tile_stored(2, buf, 64); break;
                default: _tile_stored(3, buf, 64); break;
                }
                size_t cols = n - r0 < 16 ? n - r0 : 16;
                __mmask16 mask = cols >= 16 ? 0xFFFF : (__mmask16)((1u << cols) - 1);
                __m512i r[16];
                for (int i = 0; i < 16; i++) r[i] = _mm512_load_si512(buf + i * 16);
                transpose16(r);
                for (size_t i = 0; i < 16 && h * 16 + i < m; i++)
                    _mm512_mask_storeu_ps(y + (h * 16 + i) * ldy + r0, mask, _mm512_castsi512_ps(r[i]));
            }
        }
    }
    _tile_release();
}
#else
int r2vpo_amx_init(void) { return 0; }
void r2vpo_amx_split_rows(const float *x, size_t ldx, size_t m, size_t k, size_t r0, size_t r1, uint16_t *xp,
                          size_t kp) {
    (void)x, (void)ldx, (void)m, (void)k, (void)r0, (void)r1, (void)xp, (void)kp;
    abort();
}
int r2vpo_amx_linear_cols(const uint16_t *xp, size_t m, size_t kp, const float *w, size_t ldw, size_t n, size_t k,
                          size_t c0, size_t c1, float *y, size_t ldy) {
    (void)xp, (void)m, (void)kp, (void)w, (void)ldw, (void)n, (void)k, (void)c0, (void)c1, (void)y, (void)ldy;
    abort();
}
void r2vpo_amx_small_split_x(const float *x, size_t m, size_t k, uint16_t *xb, size_t kb0, size_t kb1) {
    (void)x, (void)m, (void)k, (void)xb, (void)kb0, (void)kb1;
    abort();
}
void r2vpo_amx_small_cols(const uint16_t *xb, size_t m, size_t kp, const float *w, size_t n, size_t k, size_t c0,
                          size_t c1, float *y, size_t ldy) {
    (void)xb, (void)m, (void)kp, (void)w, (void)n, (void)k, (void)c0, (void)c1, (void)y, (void)ldy;
    abort();
}
void r2vpo_amx_bf16w_cols(const uint16_t *xb, size_t m, size_t kp, const uint16_t *w, size_t n, size_t k, size_t c0,
                          size_t c1, float *y, size_t ldy) {
    (void)xb, (void)m, (void)kp, (void)w, (void)n, (void)k, (void)c0, (void)c1, (void)y, (void)ldy;
    abort();
}
#endif
