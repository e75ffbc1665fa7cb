#!/bin/sh
# Installs what strata needs to build and test on Debian 12 (run as root, or
# with sudo available).  Skips apt-get when everything is already installed.
set -eu

PKGS="build-essential meson ninja-build pkg-config \
libnanomsg-dev libhwloc-dev libnuma-dev libjansson-dev libxxhash-dev \
libpcre2-dev libcmocka-dev libutf8proc-dev libinih-dev libsystemd-dev \
python3 python3-numpy gnuplot-nox libcsv-dev libmicrohttpd-dev curl \
bible-kjv bible-kjv-text liburing-dev libhiredis-dev redis-server"
# bible-kjv(-text): calibration text for the kjv-moe fixture
# (scripts/kjv-calib-text.py, docs/FORMATS.md)
# libhiredis-dev: kvd's remote KV tier (--remote-kv); redis-server: the
# tests of that tier start their own instance on a loopback port (the
# service the package installs is stopped and disabled below)

missing=""
for p in $PKGS; do
	dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
# nodejs, npm: the serve-openai-client test npm-installs the official
# `openai` client (tests/serve/openai-client/package-lock.json); a node
# installed another way (nodesource, which bundles npm) is kept
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
	missing="$missing nodejs npm"
fi
if [ -z "$missing" ]; then
	echo "setup: all packages present"
	exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "setup: installing$missing"
$SUDO apt-get update -qq
if ! DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing; then
	echo "setup: apt-get could not install:$missing (Debian 12 main has them all)" >&2
	exit 1
fi
# the redis-server package starts a system-wide service on port 6379; the
# tests start their own instances, so it is not left running (a failure to
# stop it is reported, not fatal: a container without an init system)
case "$missing" in
*redis-server*)
	if command -v systemctl >/dev/null 2>&1; then
		$SUDO systemctl disable --now redis-server >/dev/null 2>&1 ||
			echo "setup: note: could not stop the redis-server service"
	fi
	if [ -x /etc/init.d/redis-server ]; then
		$SUDO /etc/init.d/redis-server stop >/dev/null 2>&1 || true
	fi
	;;
esac
