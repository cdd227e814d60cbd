#!/usr/bin/env bash
# Builds paired-bench.c against the AVX2 kernel of commit aff44df (A) and
# the checkout's (B), and runs it: `bash results/bench/ab-session-18/run.sh [reps]`
# from the checkout's root.
set -euo pipefail
t=$(mktemp -d)
git show aff44df:crates/r2vpo-llm/src/model/avx2.c > "$t/before.c"
gcc -O3 -c -Dr2vpo_avx2_pack_x=A_pack_x -Dr2vpo_avx2_linear_cols=A_linear_cols "$t/before.c" -o "$t/a.o"
gcc -O3 -c -Dr2vpo_avx2_pack_x=B_pack_x -Dr2vpo_avx2_linear_cols=B_linear_cols crates/r2vpo-llm/src/model/avx2.c -o "$t/b.o"
gcc -O3 results/bench/ab-session-18/paired-bench.c "$t/a.o" "$t/b.o" -o "$t/pb" -lpthread -lm
"$t/pb" "${1:-7}"
rm -r "$t"
