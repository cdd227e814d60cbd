#!/bin/bash
# Per product shape, the seconds per timed step and GFLOP/s, from a
# `bench step --reps 2` run's stderr under trace.patch (the first third of
# the calls, the warm-up step's, skipped). Columns: kernel, m x k x n,
# operand layouts (avx2: A column-major?, B column-major?; blas: CBLAS
# transpose flags of A and B).
grep TRACE "$1" | awk '{n++; L[n]=$0} END{s=int(n/3); for(i=s+1;i<=n;i++){split(L[i],a," "); key=a[2]" "a[3]"x"a[4]"x"a[5]" "a[6]" "a[7]; t[key]+=a[8]; f[key]+=2*a[3]*a[4]*a[5]; tt[a[2]]+=a[8]} for(k in t) printf "%-36s %7.3f s %6.1f GFLOP/s\n", k, t[k]/2, f[k]/t[k]/1e9; for(k in tt) printf "total %s %.3f s per step\n", k, tt[k]/2}' | sort
