#!/usr/bin/env bash
# tools/float_order.sh: the measurement behind train.c's header. Why must sums be exact?
# This builds two copies of train.c whose weight gradients are plain float sums instead
# of exact ones, one adding all B rows in one chain, the other adding two halves of B/2
# rows and then the halves, as a 2-rank data-parallel layout would. The same arithmetic
# in another order: it prints the step where their training losses first differ, and
# both runs' validation losses and names.
#
#   bash tools/float_order.sh                # the default configuration, 25,000 steps
#   bash tools/float_order.sh --steps 5000   # any flags of train.c
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp ./*.h train.c "$work"/
python3 - "$work/layers.h" <<'PY'
import sys
path = sys.argv[1]
s = open(path).read()
old = '    matmul_exact(dw, in, 1, K, dout, K, R, J, batch, "weight gradient", ws);'
new = '''    { // float sums: all rows in one chain (HALVES unset), or two halves, then their sum
        int halves = getenv("HALVES") ? 2 : 1;
        float *xt = mallocCheck(sizeof(float) * R * K), *part = mallocCheck(sizeof(float) * K * J);
        float* acc = callocCheck((size_t)K * J, sizeof(float));
        for (int h = 0; h < halves; h++) {
            int r0 = h * R / halves, r1 = (h + 1) * R / halves;
            transpose(xt, in + (long)r0 * K, r1 - r0, K);
            matmul_float(part, xt, dout + (long)r0 * J, K, r1 - r0, J, ws);
            for (long i = 0; i < (long)K * J; i++) acc[i] += part[i];
        }
        fix_add(dw, acc, (long)K * J, batch, "weight gradient");
        free(xt), free(part), free(acc);
    }'''
if old not in s:
    sys.exit("tools/float_order.sh: layers.h's weight gradient is not where this script expects it")
open(path, "w").write(s.replace(old, new))
PY
cc -O3 -march=native -std=c11 -ffp-contract=off -fno-math-errno -o "$work/train" "$work/train.c" -lm
"$work/train" --quiet --log "$work/whole.csv" "$@" >"$work/whole.out"
HALVES=1 "$work/train" --quiet --log "$work/halves.csv" "$@" >"$work/halves.out"
paste -d, <(cut -d, -f1,2 "$work/whole.csv") <(cut -d, -f2 "$work/halves.csv") |
    awk -F, 'NR > 1 && $2 != $3 { if (!found) printf "training losses first differ at step %s: %s and %s\n", $1, $2, $3; found = 1 }
             END { if (!found) print "training losses identical at every step" }'
echo "all rows at once            | two halves, then their sum"
paste "$work/whole.out" "$work/halves.out" | awk -F'\t' '{ printf "%-27s | %s\n", $1, $2 }'
