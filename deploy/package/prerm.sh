#!/bin/sh
# prerm of vipd: stop the service before its files go (not on an upgrade,
# which postinst restarts). Stopping leaves the dataplane programmed; run
# `vipd cleanup` before removing the package to remove it too.
set -e
if [ "$1" = remove ] && [ -d /run/systemd/system ]; then
	systemctl stop vipd.service || true
fi
exit 0
