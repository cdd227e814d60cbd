#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>
#include <immintrin.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define N (16u<<20)
#define C 10
float *w[C]; pthread_barrier_t bar; float sink[2];
__attribute__((target("avx512f"))) void *run(void*arg){ size_t t=(size_t)arg; __m512 acc=_mm512_setzero_ps();
 for(int r=0;r<C*3;r++){ pthread_barrier_wait(&bar); float*p=w[r%C]+t*(N/2); for(size_t i=0;i<N/2;i+=16) acc=_mm512_add_ps(acc,_mm512_load_ps(p+i)); }
 sink[t]=_mm512_reduce_add_ps(acc); return 0;}
int main(){ for(int c=0;c<C;c++){ w[c]=aligned_alloc(64,N*4); for(size_t i=0;i<N;i++) w[c][i]=i; }
 pthread_barrier_init(&bar,0,2); pthread_t th; pthread_create(&th,0,run,(void*)1); double t=now(); run(0); pthread_join(th,0); double dt=now()-t;
 printf("stream read 2 threads: %.1f GB/s\n", (double)N*4*C*3/dt/1e9); return 0; }
