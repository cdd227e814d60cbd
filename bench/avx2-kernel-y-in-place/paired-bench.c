// The forward's products at SmolLM2's learner shapes (8 x 300 tokens; the
// LM head at the 2 048 response rows) on two builds of r2vpo's AVX2 kernel
// in one process, alternating A and B per repetition (A first on even
// repetitions, B first on odd), median of `reps` each after a warm-up
// pair, 2 pthreads splitting the columns as r2vpo does. A is the kernel of
// commit aff44df (the first AVX2 forward kernel), B that of commit 49c7c99
// (y in place). `step-weighted` weights each shape by its count in a
// training step's forward (q and o, k and v, gate and up twice per layer,
// down once, 30 layers; the head once). See run.sh for the build.
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>
#include <time.h>
#include <math.h>
#include <string.h>
void A_pack_x(const float *x, size_t m, size_t k, size_t r0, size_t r1, float *ap);
int A_linear_cols(const float *ap, size_t m, size_t k, const float *w, size_t n, size_t c0, size_t c1, float *y, size_t ldy);
void B_pack_x(const float *x, size_t m, size_t k, size_t r0, size_t r1, float *ap);
int B_linear_cols(const float *ap, size_t m, size_t k, const float *w, size_t n, size_t c0, size_t c1, float *y, size_t ldy);
typedef struct { int v, phase; const float *x, *w; float *y, *ap; size_t m, k, n, c0, c1, r0, r1; } job;
static void *run(void *p) {
    job *j = p;
    if (j->phase == 0) (j->v ? B_pack_x : A_pack_x)(j->x, j->m, j->k, j->r0, j->r1, j->ap);
    else (j->v ? B_linear_cols : A_linear_cols)(j->ap, j->m, j->k, j->w, j->n, j->c0, j->c1, j->y, j->n);
    return 0;
}
static double now() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int cmp(const void *a, const void *b) { double x = *(double*)a, y = *(double*)b; return x < y ? -1 : x > y; }
int main(int argc, char **argv) {
    int threads = 2, reps = argc > 1 ? atoi(argv[1]) : 7;
    size_t shapes[][3] = {{2400, 576, 576}, {2400, 576, 192}, {2400, 576, 1536}, {2400, 1536, 576}, {2048, 576, 49152}};
    int count[] = {2, 2, 2, 1, 0}; // per layer (q,o), (k,v), (gate,up), down; head once per 30 layers
    const char *names[] = {"q/o", "k/v", "gate/up", "down", "head"};
    double tot[2] = {0}, fl = 0;
    for (int s = 0; s < 5; s++) {
        size_t m = shapes[s][0], k = shapes[s][1], n = shapes[s][2];
        float *x = malloc(m * k * 4), *w = malloc(n * k * 4), *y[2];
        float *ap = aligned_alloc(64, (m + 5) / 6 * 6 * k * 4);
        for (size_t i = 0; i < m * k; i++) x[i] = (float)((i * 37) % 101) / 50.0f - 1;
        for (size_t i = 0; i < n * k; i++) w[i] = (float)((i * 53) % 97) / 48.0f - 1;
        double f = 2.0 * m * k * n, wt = count[s] ? 30.0 * count[s] : 1.0;
        double ts[2][64];
        for (int v = 0; v < 2; v++) { y[v] = malloc(m * n * 4); memset(y[v], 0, m * n * 4); }
        for (int rep = 0; rep < reps + 1; rep++) for (int v0 = 0; v0 < 2; v0++) {
            int v = rep % 2 ? 1 - v0 : v0;
            pthread_t t[8]; job j[8];
            size_t per = ((n + threads - 1) / threads + 15) / 16 * 16;
            size_t panels = (m + 5) / 6, pp = (panels + threads - 1) / threads;
            double t0 = now();
            for (int phase = 0; phase < 2; phase++) {
                int nt = 0;
                if (phase == 0) for (size_t r = 0; r < panels; r += pp, nt++) { j[nt] = (job){v, 0, x, w, y[v], ap, m, k, n, 0, 0, r, r + pp < panels ? r + pp : panels}; pthread_create(&t[nt], 0, run, &j[nt]); }
                else for (size_t c = 0; c < n; c += per, nt++) { j[nt] = (job){v, 1, x, w, y[v], ap, m, k, n, c, c + per < n ? c + per : n, 0, 0}; pthread_create(&t[nt], 0, run, &j[nt]); }
                for (int i = 0; i < nt; i++) pthread_join(t[i], 0);
            }
            if (rep > 0) ts[v][rep - 1] = now() - t0;
        }
        double med[2];
        for (int v = 0; v < 2; v++) { qsort(ts[v], reps, sizeof(double), cmp); med[v] = ts[v][reps / 2]; tot[v] += wt * med[v]; }
        fl += wt * f;
        double md = 0; for (size_t i = 0; i < m * n; i++) { double d = fabs(y[0][i] - y[1][i]); if (d > md) md = d; }
        printf("%-8s A %6.1f  B %6.1f GFLOP/s (median)  B/A time %.3f  maxdiff %.2g\n", names[s], f / med[0] * 1e-9, f / med[1] * 1e-9, med[1] / med[0], md);
        free(x); free(w); free(ap); for (int i = 0; i < 2; i++) free(y[i]);
    }
    printf("step-weighted  A %6.1f  B %6.1f GFLOP/s  B/A time %.3f\n", fl / tot[0] * 1e-9, fl / tot[1] * 1e-9, tot[1] / tot[0]);
}
