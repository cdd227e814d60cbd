// The forward's products at SmolLM2's learner shapes (8 x 300 tokens; the
// LM head at the 2 048 response rows): r2vpo's AVX2 kernel
// (crates/r2vpo-llm/src/model/avx2.c) against OpenBLAS 0.3.34 (the .so
// `make deps` unpacks), each on `threads` pthreads splitting the columns,
// OpenBLAS at one thread per call as r2vpo runs it. Best of 3 per shape;
// the first shape also warms the machine up. From the checkout's root,
// against the kernel as committed in 15d9cfa (later commits renamed its
// entry points):
//   git show 15d9cfa:crates/r2vpo-llm/src/model/avx2.c > /tmp/avx2-15d9cfa.c
//   gcc -O3 bench/avx2-forward-kernel-vs-openblas/forward-bench.c \
//       /tmp/avx2-15d9cfa.c -o /tmp/fb -ldl -lpthread -lm
//   /tmp/fb 2; /tmp/fb 1
#include <stdio.h>
#include <stdlib.h>
#include <dlfcn.h>
#include <pthread.h>
#include <time.h>
#include <math.h>
void r2vpo_avx2_pack_x(const float *x, size_t m, size_t k, size_t r0, size_t r1, float *ap);
int r2vpo_avx2_linear_cols(const float *ap, size_t m, size_t k, const float *w, size_t n, size_t c0, size_t c1, float *y, size_t ldy);
typedef void (*sgemm_t)(int, int, int, int, int, int, float, const float *, int, const float *, int, float, float *, int);
static sgemm_t sg;
typedef struct { int which, phase; const float *x, *w; float *y, *ap; size_t m, k, n, c0, c1, r0, r1; } job;
static void *run(void *p) {
    job *j = p;
    if (j->which == 0) { if (j->phase == 0) r2vpo_avx2_pack_x(j->x, j->m, j->k, j->r0, j->r1, j->ap); else r2vpo_avx2_linear_cols(j->ap, j->m, j->k, j->w, j->n, j->c0, j->c1, j->y, j->n); }
    else sg(101, 111, 112, j->m, j->c1 - j->c0, j->k, 1.0f, j->x, j->k, j->w + j->c0 * j->k, j->k, 0.0f, j->y + j->c0, j->n);
    return 0;
}
static double now() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char **argv) {
    void *h = dlopen(".deps/openblas/lib/libscipy_openblas.so", RTLD_NOW);
    sg = (sgemm_t)dlsym(h, "scipy_cblas_sgemm");
    void (*snt)(int) = dlsym(h, "scipy_openblas_set_num_threads"); snt(1);
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    size_t shapes[][3] = {{2400, 576, 576}, {2400, 576, 960}, {2400, 576, 3072}, {2400, 1536, 576}, {2048, 576, 49152}};
    const char *names[] = {"o", "qkv", "gate/up", "down", "head"};
    double tot[2] = {0}, fl = 0;
    for (int s = 0; s < 5; s++) {
        size_t m = shapes[s][0], k = shapes[s][1], n = shapes[s][2];
        float *x = malloc(m * k * 4), *w = malloc(n * k * 4), *y[2];
        float *ap = aligned_alloc(64, (m + 5) / 6 * 6 * k * 4);
        for (size_t i = 0; i < m * k; i++) x[i] = (float)((i * 37) % 101) / 50.0f - 1;
        for (size_t i = 0; i < n * k; i++) w[i] = (float)((i * 53) % 97) / 48.0f - 1;
        double f = 2.0 * m * k * n; fl += f;
        printf("%-8s", names[s]);
        for (int which = 0; which < 2; which++) {
            y[which] = malloc(m * n * 4);
            double best = 1e9;
            for (int rep = 0; rep < 3; rep++) {
                pthread_t t[8]; job j[8];
                size_t per = ((n + threads - 1) / threads + 15) / 16 * 16;
                size_t panels = (m + 5) / 6, pp = (panels + threads - 1) / threads;
                double t0 = now();
                for (int phase = (which == 0 ? 0 : 1); phase < 2; phase++) {
                    int nt = 0;
                    if (phase == 0) for (size_t r = 0; r < panels; r += pp, nt++) { j[nt] = (job){which, 0, x, w, y[which], ap, m, k, n, 0, 0, r, r + pp < panels ? r + pp : panels}; pthread_create(&t[nt], 0, run, &j[nt]); }
                    else for (size_t c = 0; c < n; c += per, nt++) { j[nt] = (job){which, 1, x, w, y[which], ap, m, k, n, c, c + per < n ? c + per : n, 0, 0}; pthread_create(&t[nt], 0, run, &j[nt]); }
                    for (int i = 0; i < nt; i++) pthread_join(t[i], 0);
                }
                double dt = now() - t0; if (dt < best) best = dt;
            }
            tot[which] += best;
            printf("  %s %6.1f", which == 0 ? "new" : "oblas", f / best * 1e-9);
        }
        double md = 0; for (size_t i = 0; i < m * n; i++) { double d = fabs(y[0][i] - y[1][i]); if (d > md) md = d; }
        printf("  maxdiff %.2g\n", md);
        free(x); free(w); free(ap); for (int i = 0; i < 2; i++) free(y[i]);
    }
    printf("all      new %6.1f oblas %6.1f GFLOP/s\n", fl / tot[0] * 1e-9, fl / tot[1] * 1e-9);
}
