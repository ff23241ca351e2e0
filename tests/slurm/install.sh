#!/usr/bin/env bash
# Installs the Debian 12 packages the test Slurm cluster (tests/slurm/cluster.py) needs. Run as root.
# Idempotent: when everything is already installed it only asks dpkg and exits (well under a second).
set -euo pipefail

# gcc + libc6-dev compile the SPANK stand-in plugin; libslurm-dev provides <slurm/spank.h>.
# libc6-dev is named because --no-install-recommends would otherwise leave gcc without C headers.
packages=(slurmctld slurmd slurm-client munge libslurm-dev gcc libc6-dev)

missing=()
for pkg in "${packages[@]}"; do
    status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
    [[ "$status" == installed ]] || missing+=("$pkg")
done
if ((${#missing[@]} == 0)); then
    echo "install.sh: slurm test packages already installed"
    exit 0
fi
if [[ "$(id -u)" != 0 ]]; then
    echo "install.sh: must run as root to install: ${missing[*]}" >&2
    exit 1
fi

# Without systemd the packages' post-install scripts try to start munged through /etc/init.d; a
# policy-rc.d that exits 101 forbids that. Only ours is removed again: a pre-existing one is left alone.
policy=/usr/sbin/policy-rc.d
if [[ ! -e "$policy" ]]; then
    printf '#!/bin/sh\n# temporary, from tests/slurm/install.sh: no daemon starts during apt-get\nexit 101\n' \
        >"$policy.tmp.$$"
    chmod 0755 "$policy.tmp.$$"
    mv "$policy.tmp.$$" "$policy"
    trap 'rm -f "$policy"' EXIT
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install.sh: installed ${missing[*]}"
