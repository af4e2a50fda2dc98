# tests/pages_tables.awk: each markdown table of the output (after the page, the first file)
# must be a table of the page with the same header and, row for row, the same cells in every
# column that no machine changes (times, rates and measured bubbles are not compared).
# Prints what differs, one sentence per table; nothing when all agree.
function cells(line, a,    n, i) {
    n = split(line, a, /\|/)
    for (i = 1; i <= n; i++) gsub(/^ +| +$/, "", a[i])
    return n
}
function rows_of(X, nx, i, R,    n) { # the rows of the table whose header is X[i]
    n = 0
    for (i += 2; i <= nx && X[i] ~ /^\|/; i++) R[++n] = X[i]
    return n
}
FNR == NR { P[++np] = $0; next }
{ O[++no] = $0 }
END {
    for (i = 1; i <= no; i++) {
        if (O[i] !~ /^\|/ || O[i + 1] !~ /^\| *-+/) continue
        nh = cells(O[i], H)
        split("", skip)
        for (c = 1; c <= nh; c++) if (H[c] ~ /time|tokens\/s|ms\/step|^bubble$|bubble measured|seconds/) skip[c] = 1
        nr = rows_of(O, no, i, R)
        best = "no table of the page has its header: " O[i]
        ok = 0
        for (p = 1; p <= np && !ok; p++) {
            if (P[p] != O[i]) continue
            pr = rows_of(P, np, p, Q)
            if (pr != nr) { best = "the page's table (line " p ") has " pr " rows, the output " nr; continue }
            ok = 1
            for (r = 1; r <= nr && ok; r++) {
                cells(R[r], A); cells(Q[r], B)
                for (c = 2; c < nh; c++) if (!(c in skip) && A[c] != B[c]) {
                    ok = 0
                    best = "the page's table (line " p "), row " r ", column '" H[c] "': the page says '" B[c] "', the output '" A[c] "'"
                    break
                }
            }
        }
        if (!ok) print best
        i += nr + 1
    }
}
