#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>
#include <immintrin.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
size_t k,n,copies; float **w; int reps, mode, pfd; pthread_barrier_t bar; float sink[2];
__attribute__((target("avx512f"))) void *run(void*arg){ size_t t=(size_t)arg; size_t half=(n/64)*32; size_t c0=t?half:0,c1=t?n:half;
 size_t kb_n=k/32; __m512 acc=_mm512_setzero_ps();
 for(int r=0;r<reps;r++){ pthread_barrier_wait(&bar); const float*W=w[r%copies];
  if(mode==0){ // row-major: 32 rows x 128B per k block
   for(size_t t0=c0;t0<c1;t0+=32) for(size_t kb=0;kb<kb_n;kb++){
     size_t ab=kb+pfd, at=t0; while(ab>=kb_n) ab-=kb_n, at+=32;
     for(size_t c=0;c<32;c++){ if(pfd && at<c1){ const float*pf=W+(at+c)*k+ab*32; _mm_prefetch((const char*)pf,_MM_HINT_T1); _mm_prefetch((const char*)(pf+16),_MM_HINT_T1);} 
       const float*p=W+(t0+c)*k+kb*32; acc=_mm512_add_ps(acc,_mm512_add_ps(_mm512_load_ps(p),_mm512_load_ps(p+16))); } }
  } else { // blocked: each (panel, kb) 4KB contiguous
   const float*base=W+c0*k; size_t tot=(c1-c0)*k;
   for(size_t i=0;i<tot;i+=1024){ if(pfd && i+pfd*1024<tot) for(int l=0;l<64;l++) _mm_prefetch((const char*)(base+i+pfd*1024+l*16),_MM_HINT_T1);
     for(int c=0;c<32;c++){ const float*p=base+i+c*32; acc=_mm512_add_ps(acc,_mm512_add_ps(_mm512_load_ps(p),_mm512_load_ps(p+16))); } }
  } }
 sink[t]=_mm512_reduce_add_ps(acc); return 0;}
int main(int argc,char**argv){ k=atoi(argv[1]); n=atoi(argv[2]); mode=atoi(argv[3]); pfd=atoi(argv[4]);
 copies=(600u<<20)/(n*k*4); if(!copies) copies=1; w=malloc(copies*sizeof(float*));
 for(size_t c=0;c<copies;c++){ w[c]=aligned_alloc(64,n*k*4); for(size_t i=0;i<n*k;i++) w[c][i]=(float)((i+c)%5)*0.1f; }
 reps=copies*3; pthread_barrier_init(&bar,0,2);
 pthread_t th; pthread_create(&th,0,run,(void*)1); double t=now(); run(0); pthread_join(th,0); double dt=(now()-t)/reps;
 printf("k=%zu n=%zu mode=%s pf=%d: %.1f GB/s\n",k,n,mode?"blocked":"rows",pfd, n*k*4/dt/1e9); return 0; }
