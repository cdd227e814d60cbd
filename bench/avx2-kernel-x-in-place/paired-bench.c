// The products whose left operand is row-major, at SmolLM2's learner
// shapes (8 x 300 tokens; the LM head at the 2 048 response rows), on two
// builds of r2vpo's AVX2 kernel in one process, alternating A and B per
// repetition (A first on even repetitions, B first on odd), median of
// `reps` each after a warm-up pair, 2 pthreads splitting the columns as
// r2vpo does. A (commit f7153d2) packs x into 6-row panels first (split
// over the threads, as avx2::product does), B reads x's rows in place.
// Forward: y = x · wᵀ (w's rows as stored); backward: dx = g · w (w
// row-major). `weighted` weights each shape by its count in a training
// step (30 layers; the head once). See run.sh for the build.
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
void A_pack_a(const float *a, size_t lda, int at, size_t m, size_t k, size_t r0, size_t r1, float *ap);
int A_cols(const float *ap, size_t m, size_t k, const float *b, size_t ldb, int bt, size_t n, size_t c0, size_t c1,
           float *y, size_t ldy, int acc);
int B_cols(const float *ap, const float *a, size_t lda, size_t m, size_t k, const float *b, size_t ldb, int bt,
           size_t n, size_t c0, size_t c1, float *y, size_t ldy, int acc);
typedef struct {
    int v, phase, bt;
    const float *x, *w;
    float *y, *ap;
    size_t m, k, n, c0, c1, r0, r1;
} job;
static void *run(void *p) {
    job *j = p;
    size_t ldb = j->bt ? j->k : j->n;
    if (j->phase == 0)
        A_pack_a(j->x, j->k, 0, j->m, j->k, j->r0, j->r1, j->ap);
    else if (j->v == 0)
        A_cols(j->ap, j->m, j->k, j->w, ldb, j->bt, j->n, j->c0, j->c1, j->y, j->n, 0);
    else
        B_cols(NULL, j->x, j->k, j->m, j->k, j->w, ldb, j->bt, j->n, j->c0, j->c1, j->y, j->n, 0);
    return 0;
}
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
int main(int argc, char **argv) {
    int threads = 2, reps = argc > 1 ? atoi(argv[1]) : 7;
    if (reps > 63) reps = 63;
    struct { const char *name; size_t m, k, n; int bt; double count; } sh[] = {
        {"fwd q/o", 2400, 576, 576, 1, 60},      {"fwd k/v", 2400, 576, 192, 1, 60},
        {"fwd gate/up", 2400, 576, 1536, 1, 60}, {"fwd down", 2400, 1536, 576, 1, 30},
        {"fwd head", 2048, 576, 49152, 1, 1},    {"bwd dx q/o", 2400, 576, 576, 0, 60},
        {"bwd dx k/v", 2400, 192, 576, 0, 60},   {"bwd dx gate/up", 2400, 1536, 576, 0, 60},
        {"bwd dx down", 2400, 576, 1536, 0, 30},
    };
    int ns = sizeof sh / sizeof sh[0];
    double tot[2] = {0}, fl = 0;
    printf("| shape | m x k x n | A ms | B ms | B / A | maxdiff |\n|---|---|---|---|---|---|\n");
    for (int s = 0; s < ns; s++) {
        size_t m = sh[s].m, k = sh[s].k, n = sh[s].n;
        float *x = malloc(m * k * 4), *w = malloc(n * k * 4), *y[2];
        float *ap = aligned_alloc(64, (m + 5) / 6 * 6 * k * 4);
        for (size_t i = 0; i < m * k; i++) x[i] = (float)((i * 37) % 101) / 50.0f - 1;
        for (size_t i = 0; i < n * k; i++) w[i] = (float)((i * 53) % 97) / 48.0f - 1;
        double ts[2][64];
        for (int v = 0; v < 2; v++) y[v] = calloc(m * n, 4);
        for (int rep = 0; rep < reps + 1; rep++)
            for (int v0 = 0; v0 < 2; v0++) {
                int v = rep % 2 ? 1 - v0 : v0;
                pthread_t t[8];
                job j[8];
                size_t per = ((n + threads - 1) / threads + 15) / 16 * 16;
                size_t panels = (m + 5) / 6, pp = (panels + threads - 1) / threads;
                double t0 = now();
                for (int phase = v; phase < 2; phase++) {
                    int nt = 0;
                    if (phase == 0)
                        for (size_t r = 0; r < panels; r += pp, nt++) {
                            j[nt] = (job){v, 0, sh[s].bt, x, w, y[v], ap, m, k, n, 0, 0, r, r + pp < panels ? r + pp : panels};
                            pthread_create(&t[nt], 0, run, &j[nt]);
                        }
                    else
                        for (size_t c = 0; c < n; c += per, nt++) {
                            j[nt] = (job){v, 1, sh[s].bt, x, w, y[v], ap, m, k, n, c, c + per < n ? c + per : n, 0, 0};
                            pthread_create(&t[nt], 0, run, &j[nt]);
                        }
                    for (int i = 0; i < nt; i++) pthread_join(t[i], 0);
                }
                if (rep > 0) ts[v][rep - 1] = now() - t0;
            }
        double med[2], md = 0;
        for (int v = 0; v < 2; v++) {
            qsort(ts[v], reps, sizeof(double), cmp);
            med[v] = ts[v][reps / 2];
            tot[v] += sh[s].count * med[v];
        }
        for (size_t i = 0; i < m * n; i++) md = fmax(md, fabs(y[0][i] - y[1][i]));
        fl += sh[s].count * 2.0 * m * k * n;
        printf("| %s | %zu x %zu x %zu | %.2f | %.2f | %.3f | %g |\n", sh[s].name, m, k, n, med[0] * 1e3, med[1] * 1e3,
               med[1] / med[0], md);
        free(x), free(w), free(ap), free(y[0]), free(y[1]);
    }
    printf("| weighted | | %.0f GFLOP/s | %.0f GFLOP/s | %.3f | |\n", fl / tot[0] * 1e-9, fl / tot[1] * 1e-9,
           tot[1] / tot[0]);
    return 0;
}
