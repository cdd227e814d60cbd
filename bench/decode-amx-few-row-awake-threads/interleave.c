#include <time.h>
#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>
#define T __attribute__((target("avx512f,avx512bw,avx512bf16,amx-tile,amx-bf16")))
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
typedef struct { uint8_t palette, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; } tilecfg;
T static inline void split_cvt(const float*src, __m512i out[3]){
 const __m512i hi=_mm512_set1_epi32((int)0xFFFF0000u);
 __m512 a=_mm512_loadu_ps(src), b=_mm512_loadu_ps(src+16);
 __m512 a0=_mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(a),hi)), b0=_mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(b),hi));
 __m512 ar=_mm512_sub_ps(a,a0), br=_mm512_sub_ps(b,b0);
 __m512 a1=_mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(ar),hi)), b1=_mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(br),hi));
 __m512 a2=_mm512_sub_ps(ar,a1), b2=_mm512_sub_ps(br,b1);
 out[0]=(__m512i)_mm512_cvtne2ps_pbh(b0,a0); out[1]=(__m512i)_mm512_cvtne2ps_pbh(b1,a1); out[2]=(__m512i)_mm512_cvtne2ps_pbh(b2,a2);
}
#define K 576
float w[64*K] __attribute__((aligned(64)));
uint16_t abuf[2][3072] __attribute__((aligned(64)));
uint16_t xb[3072*18] __attribute__((aligned(64)));
T static inline void split(int s, int r0, int r1){ __m512i pc[3]; int kb=s%(K/32); for(int c=r0;c<r1;c++){ split_cvt(w+c*K+kb*32,pc); for(int p=0;p<3;p++) _mm512_store_si512(abuf[s&1]+(p*2+c/16)*512+(c%16)*32,pc[p]); } }
#define TDP4 _tile_dpbf16ps(0,4,6); _tile_dpbf16ps(2,5,6); _tile_dpbf16ps(1,4,7); _tile_dpbf16ps(3,5,7);
T static inline void tdps(int s, int loads){ const uint16_t*a=abuf[s&1]; if(loads){_tile_loadd(4,a,64);_tile_loadd(5,a+512,64);_tile_loadd(6,xb,64);_tile_loadd(7,xb+512,64);} TDP4 TDP4 TDP4 TDP4 TDP4 TDP4 }

#define STEP(A_NEXT, B_NEXT) _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(2, 5, 6); if (B_NEXT >= 0) _tile_loadd(6, b + B_NEXT * 1024, 64); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(3, 5, 7); if (A_NEXT >= 0) { _tile_loadd(4, a + A_NEXT * 1024, 64); _tile_loadd(5, a + A_NEXT * 1024 + 512, 64); } if (B_NEXT >= 0) _tile_loadd(7, b + B_NEXT * 1024 + 512, 64);
T static inline void steps(int s, int interleave, int bwalk){ const uint16_t*a=abuf[s&1]; const uint16_t*b= xb + (bwalk ? (s%18)*3072 : 0);
 _tile_loadd(4, a, 64); _tile_loadd(5, a + 512, 64); _tile_loadd(6, b, 64); _tile_loadd(7, b + 512, 64);
 STEP(-1,1) if(interleave) split(s+1,0,6); STEP(-1,2) if(interleave) split(s+1,6,12); STEP(1,0) if(interleave) split(s+1,12,17); STEP(-1,1) if(interleave) split(s+1,17,22); STEP(2,0) if(interleave) split(s+1,22,27); STEP(-1,-1) if(interleave) split(s+1,27,32); }
T int main(){
 syscall(SYS_arch_prctl, 0x1023, 18);
 tilecfg cfg; memset(&cfg,0,sizeof cfg); cfg.palette=1; for(int t=0;t<8;t++){cfg.rows[t]=16;cfg.colsb[t]=64;} _tile_loadconfig(&cfg);
 for(int i=0;i<64*K;i++) w[i]=i*1e-3f; memset(xb,0,sizeof xb);
 int N=200000; double t;
 for(int rep=0;rep<2;rep++){
 t=now(); for(int s=0;s<N;s++) split(s,0,32); printf("split only      %.1f ns/block\n",(now()-t)/N*1e9);
 t=now(); for(int s=0;s<N;s++) tdps(s,1); printf("tdp only        %.1f ns/block\n",(now()-t)/N*1e9);
 t=now(); for(int s=0;s<N;s++) { split(s+1,0,32); tdps(s,1);} printf("split then tdp  %.1f ns/block\n",(now()-t)/N*1e9);
 t=now(); for(int s=0;s<N;s++) { const uint16_t*a=abuf[s&1]; _tile_loadd(4,a,64);_tile_loadd(5,a+512,64);_tile_loadd(6,xb,64);_tile_loadd(7,xb+512,64);
   TDP4 split(s+1,0,6); TDP4 split(s+1,6,12); TDP4 split(s+1,12,17); TDP4 split(s+1,17,22); TDP4 split(s+1,22,27); TDP4 split(s+1,27,32);} printf("interleaved     %.1f ns/block\n",(now()-t)/N*1e9);
 t=now(); for(int s=0;s<N;s++) { tdps(s,0); } printf("tdp no loads    %.1f ns/block\n",(now()-t)/N*1e9);
 t=now(); for(int s=0;s<N;s++) { split(s+1,0,32); tdps(s,0);} printf("split+tdp noload %.1f ns/block\n",(now()-t)/N*1e9);
 t=now(); for(int s=0;s<N;s++) steps(s,0,0); printf("STEP only       %.1f ns/block\n",(now()-t)/N*1e9);
 t=now(); for(int s=0;s<N;s++) steps(s,1,0); printf("STEP interleave %.1f ns/block\n",(now()-t)/N*1e9);
 t=now(); for(int s=0;s<N;s++) steps(s,0,1); printf("STEP only bwalk %.1f ns/block\n",(now()-t)/N*1e9);
 t=now(); for(int s=0;s<N;s++) steps(s,1,1); printf("STEP intl bwalk %.1f ns/block\n",(now()-t)/N*1e9);
 }
 _tile_release(); return 0; }
