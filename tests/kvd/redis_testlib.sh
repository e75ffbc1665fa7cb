# redis_testlib.sh — sourced by the remote KV tier's test and benchmark
# (tests/kvd/test_kv_remote.sh, scripts/bench-remote-kv.sh): a private
# redis-server per caller on a free loopback port, no persistence, stopped
# on exit.  Needs redis-server and redis-cli (scripts/setup-debian.sh
# installs them); need_redis exits 77 (skip) where they are absent, 1 under
# CI.
#
#   need_redis
#   redis_start DIR [redis-server options...]   sets REDIS_PORT, REDIS_PID,
#                                               REDIS_URL
#   rcli ARGS...                                 redis-cli on that port
#   redis_stop                                   (SIGCONT first: a paused
#                                               one dies too)

need_redis() {
	if command -v redis-server >/dev/null 2>&1 &&
	   command -v redis-cli >/dev/null 2>&1; then
		return 0
	fi
	echo "redis-server / redis-cli not installed (scripts/setup-debian.sh installs redis-server)"
	[ "${CI:-}" = true ] && exit 1
	exit 77
}

redis_free_port() {
	/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

redis_start() { # DIR [options]; REDIS_PORT_WANT=N: that port (a restart)
	_rdir=$1; shift
	REDIS_PORT=${REDIS_PORT_WANT:-$(redis_free_port)}
	redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" \
		--appendonly no --dir "$_rdir" --logfile "$_rdir/redis-$REDIS_PORT.log" \
		"$@" >/dev/null 2>&1 &
	REDIS_PID=$!
	REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0"
	for _i in $(seq 1 100); do
		[ "$(redis-cli -p "$REDIS_PORT" ping 2>/dev/null)" = PONG ] && return 0
		sleep 0.05
	done
	echo "FAIL: redis-server on port $REDIS_PORT did not answer"
	cat "$_rdir/redis-$REDIS_PORT.log" 2>/dev/null
	return 1
}

rcli() {
	redis-cli -p "$REDIS_PORT" "$@"
}

redis_stop() {
	[ -n "${REDIS_PID:-}" ] || return 0
	kill -CONT "$REDIS_PID" 2>/dev/null
	kill "$REDIS_PID" 2>/dev/null
	wait "$REDIS_PID" 2>/dev/null
	REDIS_PID=
}
