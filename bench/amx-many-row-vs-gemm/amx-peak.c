// AMX bf16 peak on this VM: tdpbf16ps on 4 accumulators, operands from L1.
#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <time.h>
#include <stdlib.h>
#include <pthread.h>
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
typedef struct { uint8_t palette, start_row; uint8_t r[14]; uint16_t colsb[16]; uint8_t rows[16]; } cfg_t;
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static uint16_t A[16*32] __attribute__((aligned(64))), B[16*32] __attribute__((aligned(64)));
static float C[16*16] __attribute__((aligned(64)));
static long ITERS=20000000;
void *run(void*arg){
  if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)) { perror("arch_prctl"); return 0; }
  cfg_t c; memset(&c,0,sizeof c); c.palette=1;
  for(int i=0;i<8;i++){c.colsb[i]=64;c.rows[i]=16;}
  _tile_loadconfig(&c);
  _tile_zero(0);_tile_zero(1);_tile_zero(2);_tile_zero(3);
  _tile_loadd(4,A,64);_tile_loadd(5,A,64);_tile_loadd(6,B,64);_tile_loadd(7,B,64);
  double t0=now();
  for(long i=0;i<ITERS;i++){
    _tile_dpbf16ps(0,4,6);_tile_dpbf16ps(1,4,7);_tile_dpbf16ps(2,5,6);_tile_dpbf16ps(3,5,7);
  }
  double t=now()-t0;
  _tile_stored(0,C,64);
  double fl=ITERS*4.0*16*16*32*2;
  printf("thread: %.1f GFLOP/s (%.3f s) c=%f\n",fl/t/1e9,t,C[0]);
  _tile_release();
  return 0;
}
int main(int argc,char**argv){
  int n=argc>1?atoi(argv[1]):1;
  pthread_t th[8];
  for(int i=0;i<n;i++)pthread_create(&th[i],0,run,0);
  for(int i=0;i<n;i++)pthread_join(th[i],0);
}
