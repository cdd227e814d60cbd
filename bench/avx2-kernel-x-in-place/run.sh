#!/usr/bin/env bash
# Builds paired-bench.c against the AVX2 kernel of commit f7153d2 (A: x
# packed first) and of commit bb3af05 (B: x's rows read in place), and runs
# it: `bash bench/avx2-kernel-x-in-place/run.sh [reps]` from the checkout's
# root. Both kernels come from git, so any checkout reproduces the comparison.
set -euo pipefail
t=$(mktemp -d)
git show f7153d2:crates/r2vpo-llm/src/model/avx2.c > "$t/before.c"
git show bb3af05:crates/r2vpo-llm/src/model/avx2.c > "$t/after.c"
gcc -O3 -c -Dr2vpo_avx2_pack_a=A_pack_a -Dr2vpo_avx2_cols=A_cols -Dr2vpo_avx2_product_here=A_here "$t/before.c" -o "$t/a.o"
gcc -O3 -c -Dr2vpo_avx2_pack_a=B_pack_a -Dr2vpo_avx2_cols=B_cols -Dr2vpo_avx2_product_here=B_here "$t/after.c" -o "$t/b.o"
gcc -O3 bench/avx2-kernel-x-in-place/paired-bench.c "$t/a.o" "$t/b.o" -o "$t/pb" -lpthread -lm
"$t/pb" "${1:-7}"
rm -r "$t"
