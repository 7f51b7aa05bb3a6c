# Sourced by scripts/bench and scripts/bench-instructions: writes to the folder $1 the
# manifests of deploy/standalone with its enterprise Tier replaced by
# tests/bench-manifests/enterprise-tier.yaml (the shipped tier limits, RPM, TPM and
# concurrent streams, would otherwise throttle a load test). Run from the repository root.
bench_manifests() {
    local manifests=$1 dropped_list
    dropped_list=$(mktemp)
    mkdir -p "$manifests"
    shopt -s nullglob
    for file in deploy/standalone/*.yaml deploy/standalone/*.yml; do
        # Copy every document except a `kind: Tier` whose spec says `tier: enterprise`.
        awk -v dropfile="$dropped_list" '
            function flush() {
                if (doc != "") {
                    if (doc ~ /\nkind:[ \t]*Tier[ \t]*(\n|$)/ && doc ~ /\n[ \t]+tier:[ \t]*"?enterprise"?[ \t]*(\n|$)/) {
                        print FILENAME >> dropfile
                    } else {
                        printf "%s", substr(doc, 2) "\n"
                    }
                }
                doc = ""
            }
            /^---/ { flush(); print; next }
            { doc = doc "\n" $0 }
            END { flush() }
        ' "$file" > "$manifests/$(basename "$file")"
    done
    shopt -u nullglob
    local dropped
    dropped=$(wc -l < "$dropped_list")
    rm -f "$dropped_list"
    if [[ $dropped != 1 ]]; then
        echo "bench: expected one enterprise Tier document in deploy/standalone, found $dropped" >&2
        return 1
    fi
    cp tests/bench-manifests/enterprise-tier.yaml "$manifests/zz-bench-enterprise-tier.yaml"
}
