# Shared by benchmarks/gpu_check.sh and benchmarks/gpu_marl.sh (sourced, not run): timed steps
# inside one overall budget. The caller sets TAG (the log prefix), BUDGET (seconds, counted
# from the script's start by bash's SECONDS) and OUT (the folder that comes back).

note() { echo "[$TAG +${SECONDS}s] $*" | tee -a "$OUT/summary.txt"; }

# step NAME CAP_S LOGFILE CMD...: run CMD under timeout min(CAP_S, budget left), log to $OUT/LOGFILE;
# skipped when under 20 s of the budget are left.
step() {
    local name=$1 cap=$2 logf=$3
    shift 3
    local left=$((BUDGET - SECONDS))
    local limit=$((cap < left ? cap : left))
    if [ "$limit" -lt 20 ]; then
        note "$name: SKIPPED (only ${left}s of the ${BUDGET}s budget left)"
        return 0
    fi
    local t0=$SECONDS
    timeout --kill-after=10 "$limit" "$@" >"$OUT/$logf" 2>&1
    local rc=$?
    local verdict=ok
    [ "$rc" -ne 0 ] && verdict="FAILED"
    [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && verdict="TIMED OUT after ${limit}s"
    note "$name: rc=$rc ($verdict), $((SECONDS - t0))s, log $logf: $(tail -n 1 "$OUT/$logf" | cut -c1-160)"
}
