#include <immintrin.h>
#include <stdio.h>
#include <time.h>
#include <pthread.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
__attribute__((target("avx2,fma"))) void* run(void*p){
  __m256 a[12]; __m256 x=_mm256_set1_ps(0.999999f), y=_mm256_set1_ps(1e-6f);
  for(int i=0;i<12;i++) a[i]=_mm256_set1_ps(i);
  long n=2000000000L/12;
  for(long i=0;i<n;i++){ for(int j=0;j<12;j++) a[j]=_mm256_fmadd_ps(a[j],x,y); }
  float s=0; for(int i=0;i<12;i++){ float t[8]; _mm256_storeu_ps(t,a[i]); s+=t[0];}
  *(float*)p=s; return 0;}
int main(int c,char**v){int T=atoi(v[1]); pthread_t th[4]; float r[4]; double t=now();
 for(int i=0;i<T;i++) pthread_create(&th[i],0,run,&r[i]); for(int i=0;i<T;i++) pthread_join(th[i],0);
 t=now()-t; double fl=T*(2000000000L/12)*12.0*16; printf("%d threads: %.1f GFLOP/s (%.3f s) %f\n",T,fl/t/1e9,t,r[0]);}
