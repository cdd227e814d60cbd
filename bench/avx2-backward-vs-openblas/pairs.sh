#!/bin/bash
# pairs of whole steps, old then new, alternating
export RAYON_NUM_THREADS=2
A="bench step --shape /work/main/configs/shapes/smollm2-135m.json --batch 8 --prompt 44 --response 256 --reps 2"
for i in $(seq 1 $1); do
  o=$(/tmp/r2vpo-old $A 2>/dev/null | grep -E "^\| [0-9]" | head -1)
  n=$(/tmp/r2vpo-new $A 2>/dev/null | grep -E "^\| [0-9]" | head -1)
  echo "step pair $i: old $o new $n"
done
for i in $(seq 1 $2); do
  o=$(/tmp/r2vpo-old $A --score 2>/dev/null | grep -E "^\| [0-9]" | head -1)
  n=$(/tmp/r2vpo-new $A --score 2>/dev/null | grep -E "^\| [0-9]" | head -1)
  echo "score pair $i: old $o new $n"
done
