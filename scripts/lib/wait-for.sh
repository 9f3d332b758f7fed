# Sourced by the benchmark scripts that start servers and wait for their logs.
# wait_for FILE PATTERN SECONDS: polls until FILE contains PATTERN; on a
# timeout says so through the caller's log function, prints FILE's last 20
# lines and fails.
wait_for() {
	local deadline=$((SECONDS + $3))
	while ((SECONDS < deadline)); do
		grep -q -- "$2" "$1" 2>/dev/null && return 0
		sleep 0.2
	done
	log "timed out waiting for '$2' in $1:"
	tail -n 20 "$1" >&2
	return 1
}
