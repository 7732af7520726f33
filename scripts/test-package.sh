#!/usr/bin/env bash
# Builds the Debian package (scripts/package.sh), installs it with dpkg -i,
# checks what it installed, and removes it again (dpkg --purge), so the
# machine is left as it was. Needs root and dpkg; skipped otherwise. The
# unit is checked with systemd-analyze verify where that exists; systemd
# itself need not run.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ] || ! command -v dpkg >/dev/null; then
    echo "SKIPPED: installing the package needs root and dpkg"
    exit 0
fi
if dpkg-query -W -f='${Status}' natrix 2>/dev/null | grep -q 'installed'; then
    echo "test-package.sh: a natrix package is already installed here; not touching it" >&2
    exit 1
fi

started=$(date +%s)
failures=0
check() {
    local what=$1
    shift
    if "$@"; then
        echo "ok: $what"
    else
        echo "FAILED: $what" >&2
        failures=$((failures + 1))
    fi
}

deb=$(./scripts/package.sh | tail -n 1)
built=$(date +%s)
echo "package: $deb ($((built - started)) s to build)"
dpkg-deb --info "$deb" | sed -n '/Package:/,$p'

purge() { dpkg --purge natrix >/dev/null 2>&1 || true; }
trap purge EXIT
dpkg -i "$deb"

version=$(/usr/bin/natrix --version)
echo "natrix --version: $version"
check "--version gives the version and the commit" grep -Eq '^natrix [0-9]+\.[0-9]+\.[0-9]+ \(([0-9a-f]{7,}|unknown)\)$' <<<"$version"
if commit=$(git rev-parse --short=7 HEAD 2>/dev/null); then
    check "--version names HEAD ($commit)" grep -q "($commit)" <<<"$version"
fi
check "natrix check-config /etc/natrix/natrix.toml" /usr/bin/natrix check-config /etc/natrix/natrix.toml
check "/etc/natrix/natrix.toml is a conffile" grep -q '/etc/natrix/natrix.toml' <(dpkg-query -W -f='${Conffiles}' natrix)

# Minimal images may keep dpkg from installing manual pages at all.
if grep -rqs 'path-exclude.*/usr/share/man' /etc/dpkg/dpkg.cfg /etc/dpkg/dpkg.cfg.d/; then
    echo "skipped: this host's dpkg configuration excludes /usr/share/man"
else
    check "natrix.1.gz installed" test -s /usr/share/man/man1/natrix.1.gz
    check "natrix-run.1.gz installed" test -s /usr/share/man/man1/natrix-run.1.gz
    check "natrix.1 has a synopsis and FILES" bash -c 'zcat /usr/share/man/man1/natrix.1.gz | grep -q "^\.SH SYNOPSIS" && zcat /usr/share/man/man1/natrix.1.gz | grep -q "^\.SH FILES"'
    if command -v man >/dev/null; then
        check "man -w natrix" test "$(man -w natrix 2>/dev/null)" = /usr/share/man/man1/natrix.1.gz
    fi
fi
check "bash completion" grep -q 'check-config' /usr/share/bash-completion/completions/natrix
check "zsh completion" grep -q '#compdef natrix' /usr/share/zsh/vendor-completions/_natrix
check "fish completion" grep -q 'complete -c natrix' /usr/share/fish/vendor_completions.d/natrix.fish
if command -v bash >/dev/null; then
    check "bash completion loads" bash -c 'source /usr/share/bash-completion/completions/natrix && complete -p natrix >/dev/null'
fi
check "README and LICENSE in /usr/share/doc/natrix" test -s /usr/share/doc/natrix/README.md -a -s /usr/share/doc/natrix/LICENSE
check "the systemd unit is installed" test -s /lib/systemd/system/natrix.service
check "the unit reloads with SIGHUP" grep -q '^ExecReload=/bin/kill -HUP \$MAINPID$' /lib/systemd/system/natrix.service
if command -v systemd-analyze >/dev/null; then
    man_check=no
    command -v man >/dev/null && [ -e /usr/share/man/man1/natrix.1.gz ] && man_check=yes
    # Only natrix.service's own complaints count; verify also reads the
    # units it refers to.
    out=$(systemd-analyze verify --man="$man_check" /lib/systemd/system/natrix.service 2>&1) || true
    [ -z "$out" ] || echo "$out"
    check "systemd-analyze verify natrix.service" test -z "$(grep -i 'natrix' <<<"$out")"
else
    echo "skipped: systemd-analyze verify (systemd-analyze is not installed; apt-get install systemd brings it)"
fi

dpkg -r natrix >/dev/null
check "dpkg -r removes the binary and the unit" test ! -e /usr/bin/natrix -a ! -e /lib/systemd/system/natrix.service
check "dpkg -r keeps the configuration" test -e /etc/natrix/natrix.toml
dpkg --purge natrix >/dev/null
check "dpkg --purge removes /etc/natrix" test ! -e /etc/natrix
check "nothing of natrix is left in dpkg's database" bash -c '! dpkg-query -W natrix >/dev/null 2>&1 || ! dpkg-query -W -f="\${Status}" natrix | grep -q installed'
trap - EXIT

echo "package build and test: $(($(date +%s) - started)) s"
if [ "$failures" -gt 0 ]; then
    echo "$failures package check(s) failed" >&2
    exit 1
fi
echo "package: all checks passed"
