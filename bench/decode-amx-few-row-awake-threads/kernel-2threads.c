#include <time.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <pthread.h>
int r2vpo_amx_init(void);
void r2vpo_amx_small_split_x(const float *x, size_t m, size_t k, uint16_t *xb, size_t kb0, size_t kb1);
void r2vpo_amx_small_cols(const uint16_t *xb, size_t m, size_t kp, const float *w, size_t n, size_t k, size_t c0, size_t c1, float *y, size_t ldy);
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
size_t m,k,n,kp,copies; float **w,*y; uint16_t*xb; int reps; pthread_barrier_t bar;
void *run(void*arg){ size_t t=(size_t)arg; size_t half=(n/64)*32; size_t c0=t?half:0,c1=t?n:half;
 for(int r=0;r<reps;r++){ pthread_barrier_wait(&bar); r2vpo_amx_small_cols(xb,m,kp,w[r%copies],n,k,c0,c1,y,n);} return 0;}
int main(int argc,char**argv){
 r2vpo_amx_init();
 m=argc>1?atoi(argv[1]):32; k=argc>2?atoi(argv[2]):576; n=argc>3?atoi(argv[3]):3072;
 copies = getenv("HOT") ? 1 : (600u<<20)/(n*k*4); if(!copies) copies=1;
 float *x=malloc(m*k*4); y=malloc(m*n*4); w=malloc(copies*sizeof(float*));
 for(size_t c=0;c<copies;c++){ w[c]=aligned_alloc(64,n*k*4); for(size_t i=0;i<n*k;i++) w[c][i]=(float)((i+c)%5)*0.1f; }
 for(size_t i=0;i<m*k;i++) x[i]=(i%7)*0.1f;
 kp=(k+31)/32*32; xb=aligned_alloc(64,kp/32*3*2*512*2); r2vpo_amx_small_split_x(x,m,k,xb,0,kp/32);
 reps=copies*2; if(reps<40) reps=40; if(getenv("REPS")) reps=atoi(getenv("REPS")); pthread_barrier_init(&bar,0,2);
 pthread_t th; pthread_create(&th,0,run,(void*)1); double t=now(); run(0); pthread_join(th,0); double dt=(now()-t)/reps;
 printf("2 threads m=%zu k=%zu n=%zu: %.1f GFLOP/s, %.1f GB/s\n",m,k,n, 2.0*m*n*k/dt/1e9, n*k*4/dt/1e9);
 return 0; }
