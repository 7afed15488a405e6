#!/bin/sh
# postrm of vipd: on purge, remove the unit's enablement links, vipd's
# state and what was dropped into /etc/vipd (dpkg removes the conffile).
set -e
case "$1" in
remove)
	if [ -d /run/systemd/system ]; then
		systemctl --system daemon-reload >/dev/null || true
	fi
	;;
purge)
	if command -v deb-systemd-helper >/dev/null 2>&1; then
		deb-systemd-helper purge vipd.service >/dev/null || true
	fi
	if [ -d /run/systemd/system ]; then
		systemctl --system daemon-reload >/dev/null || true
	fi
	rm -rf /var/lib/vipd /etc/vipd/services.d
	rmdir /etc/vipd 2>/dev/null || true
	;;
esac
exit 0
