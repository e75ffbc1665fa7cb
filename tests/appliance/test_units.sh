#!/bin/sh
# The systemd side of the launcher, without systemd:
#  - `strata exec kvd` becomes kvd (same pid) and, with $NOTIFY_SOCKET set,
#    kvd sends READY=1 once it answers PING (Type=notify readiness), and
#    STOPPING=1 when it stops;
#  - `meson install` puts the unit templates (Type=notify, Restart=on-
#    failure, strata exec with the instance's config) and the docs in place.
set -u
unset MALLOC_PERTURB_
STRATA="$STRATA_BUILD_DIR/cli/strata"
PY=/usr/bin/python3
TMP=$(mktemp -d /tmp/strata-units-XXXXXX)
trap 'rm -rf "$TMP"' EXIT
trap 'exit 1' INT TERM  # a killed test (meson's timeout) cleans up too
fail=0
inst="un$$"

if grep -q 'ST_HAVE_LIBSYSTEMD 1' "$STRATA_BUILD_DIR/st_build_config.h"; then
	cat >"$TMP/inst.conf" <<CONF
[instance]
name = $inst
numa = off
[kv]
budget = 16MiB
CONF
	$PY - "$STRATA" "$TMP" "$inst" <<'PY' || fail=1
import os, socket, subprocess, sys, time
strata, tmp, inst = sys.argv[1], sys.argv[2], sys.argv[3]
path = os.path.join(tmp, "notify.sock")
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(path)
s.settimeout(20)
env = dict(os.environ, NOTIFY_SOCKET=path)
run = os.path.join(tmp, "run")
p = subprocess.Popen([strata, "exec", "kvd", "--config",
                      os.path.join(tmp, "inst.conf"), "--run-dir", run],
                     env=env, stderr=open(os.path.join(tmp, "kvd.err"), "w"))
ok = True
try:
    msg = s.recv(4096).decode()
except socket.timeout:
    print("FAIL: no sd_notify message"); msg = ""; ok = False
if "READY=1" not in msg:
    print("FAIL: first message is not READY=1: %r" % msg); ok = False
pid = open(os.path.join(run, "kvd.pid")).read().strip() if ok else "?"
if ok and int(pid) != p.pid:
    print("FAIL: kvd pid %s is not the exec'd process %d" % (pid, p.pid)); ok = False
# ready means it answers: the socket exists
if ok and not os.path.exists(os.path.join(run, "kvd.ctl")):
    print("FAIL: READY=1 before kvd.ctl exists"); ok = False
p.terminate()
try:
    msg = s.recv(4096).decode()
    if "STOPPING=1" not in msg:
        print("FAIL: expected STOPPING=1, got %r" % msg); ok = False
except socket.timeout:
    print("FAIL: no STOPPING=1"); ok = False
p.wait(20)
if os.path.exists(os.path.join(run, "kvd.pid")):
    print("FAIL: kvd.pid left behind"); ok = False
print("sd_notify READY=1 / STOPPING=1 from the exec'd kvd: %s" % ("ok" if ok else "FAIL"))
sys.exit(0 if ok else 1)
PY
else
	echo "built without libsystemd: units use Type=simple; readiness not tested"
fi

# meson install of the units and docs
meson install -C "$STRATA_BUILD_DIR" --destdir "$TMP/dest" --no-rebuild \
	>"$TMP/install.log" 2>&1 || { echo "FAIL: meson install"; tail "$TMP/install.log"; exit 1; }
for d in expertd kvd computed; do
	u=$(find "$TMP/dest" -name "strata-$d@.service" | head -1)
	if [ -z "$u" ]; then echo "FAIL: strata-$d@.service not installed"; fail=1; continue; fi
	grep -q '^Restart=on-failure' "$u" || { echo "FAIL: $u: no Restart=on-failure"; fail=1; }
	grep -q "^ExecStart=.*/strata exec $d --config /etc/strata/%i.conf" "$u" ||
		{ echo "FAIL: $u: ExecStart"; fail=1; }
	grep -q '^RuntimeDirectoryMode=0700' "$u" || { echo "FAIL: $u: run dir mode"; fail=1; }
	if grep -q 'ST_HAVE_LIBSYSTEMD 1' "$STRATA_BUILD_DIR/st_build_config.h"; then
		grep -q '^Type=notify' "$u" || { echo "FAIL: $u: not Type=notify"; fail=1; }
	fi
done
[ -n "$(find "$TMP/dest" -name 'strata@.target')" ] || { echo "FAIL: strata@.target not installed"; fail=1; }
[ -n "$(find "$TMP/dest" -name 'TROUBLESHOOTING.md')" ] || { echo "FAIL: TROUBLESHOOTING.md not installed"; fail=1; }
[ -n "$(find "$TMP/dest" -name 'strata.conf.example')" ] || { echo "FAIL: strata.conf.example not installed"; fail=1; }
[ $fail = 0 ] && echo "units installed: ok"
exit $fail
