# instance_env.sh — sourced by the shell tests that start strata instances
# (tests/faults/test_chaos.sh, test_pidfile.sh, tests/appliance/
# test_registry.sh, tests/integration/test_store_other.sh): the strata
# binary, the fixture models, and helpers.
# what a daemon touches in production: no malloc perturbation
unset MALLOC_PERTURB_
STRATA="$STRATA_BUILD_DIR/cli/strata"
FIXTURES="${STRATA_SHARED_DIR:-../shared}/fixtures/models"

# need_fixture NAME...: exit 77 (skip) when a fixture model is missing,
# 1 under CI (CI=true), where a missing fixture is a failure.
need_fixture() {
	for m; do
		[ -d "$FIXTURES/$m" ] && continue
		echo "fixture $FIXTURES/$m missing"
		[ "${CI:-}" = true ] && exit 1
		exit 77
	done
}

# alive PID: runs and is not a zombie (where init does not reap the
# daemons strata up left behind, a stopped one stays a zombie)
alive() { [ -r "/proc/$1/stat" ] && ! sed 's/.*) //' "/proc/$1/stat" | grep -q '^[ZX]'; }

# a free TCP port on 127.0.0.1 (free now, very likely still free a moment later)
free_port() {
	/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
