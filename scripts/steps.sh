# Shared by .ci/run and scripts/*.sh: `step NAME COMMAND...` runs COMMAND and prints
# "step NAME: <seconds>s", returning its status.

now_ms() {
    if [ -n "${EPOCHREALTIME:-}" ]; then
        local t=${EPOCHREALTIME/[.,]/}
        echo $((t / 1000))
    else
        echo $(($(date +%s) * 1000))
    fi
}

step() {
    local name=$1 start rc=0 elapsed
    shift
    start=$(now_ms)
    "$@" || rc=$?
    elapsed=$(($(now_ms) - start))
    printf 'step %s: %d.%01ds\n' "$name" $((elapsed / 1000)) $((elapsed % 1000 / 100))
    return "$rc"
}
