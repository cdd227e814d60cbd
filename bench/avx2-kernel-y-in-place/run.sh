#!/usr/bin/env bash
# Builds paired-bench.c against the AVX2 kernel of commit aff44df (A: y
# copied through an aligned buffer, w prefetched) and of commit 49c7c99 (B:
# y read and written in place, x prefetched only), and runs it:
# `bash bench/avx2-kernel-y-in-place/run.sh [reps]` from the checkout's root.
# Both kernels come from git, so any checkout reproduces the comparison.
set -euo pipefail
t=$(mktemp -d)
git show aff44df:crates/r2vpo-llm/src/model/avx2.c > "$t/before.c"
git show 49c7c99:crates/r2vpo-llm/src/model/avx2.c > "$t/after.c"
gcc -O3 -c -Dr2vpo_avx2_pack_x=A_pack_x -Dr2vpo_avx2_linear_cols=A_linear_cols "$t/before.c" -o "$t/a.o"
gcc -O3 -c -Dr2vpo_avx2_pack_x=B_pack_x -Dr2vpo_avx2_linear_cols=B_linear_cols "$t/after.c" -o "$t/b.o"
gcc -O3 bench/avx2-kernel-y-in-place/paired-bench.c "$t/a.o" "$t/b.o" -o "$t/pb" -lpthread -lm
"$t/pb" "${1:-7}"
rm -r "$t"
