#!/bin/sh
# postinst of vipd: tell systemd about the unit, and restart a vipd that
# runs under it on an upgrade. Installing starts nothing: enabling vipd
# hands it the node's service traffic, which the administrator decides
# (`systemctl enable --now vipd`). Without systemd as PID 1 (a container,
# a chroot) it does nothing at all.
set -e
if [ "$1" = configure ] && [ -d /run/systemd/system ]; then
	if command -v deb-systemd-helper >/dev/null 2>&1; then
		# Records the unit's state, so that a purge removes its links.
		deb-systemd-helper update-state vipd.service >/dev/null || true
	fi
	systemctl --system daemon-reload >/dev/null || true
	if [ -n "$2" ]; then
		# An upgrade: the dataplane stays programmed across the restart.
		systemctl try-restart vipd.service || true
	fi
fi
exit 0
