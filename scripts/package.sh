#!/usr/bin/env bash
# Builds the Debian package of natrix and prints its path (the last line of
# the output): the release binary, /etc/natrix/natrix.toml, the manual pages
# and shell completions (generated from the binary's own command-line
# definitions), and the natrix.service systemd unit.
#   sudo dpkg -i target/debian/natrix_*.deb
# Installs cargo-deb first when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
# Where [package.metadata.deb] in crates/cli/Cargo.toml expects the
# generated files, whatever the cargo target directory.
ASSETS="$PWD/target/assets"

step() { printf '=== %s\n' "$*" >&2; }

if ! cargo deb --version >/dev/null 2>&1; then
    step "installing cargo-deb"
    cargo install cargo-deb --locked --version '^3' >&2
fi

step "release build"
cargo build --release -p natrix >&2
natrix="$TARGET_DIR/release/natrix"

step "manual pages and completions"
rm -rf "$ASSETS"
mkdir -p "$ASSETS/man" "$ASSETS/completions"
"$natrix" man --out "$ASSETS/man"
"$natrix" completions bash >"$ASSETS/completions/natrix.bash"
"$natrix" completions zsh >"$ASSETS/completions/_natrix"
"$natrix" completions fish >"$ASSETS/completions/natrix.fish"

step "cargo deb"
# The binary was just built; cargo deb strips it and keeps its debug
# symbols under /usr/lib/debug in the same package.
# Its warning that target/assets is not a cargo output is expected: those
# files were just generated above.
deb=$(cargo deb -p natrix --no-build --output "$TARGET_DIR/debian/" \
    2> >(grep -v "^warning: Only source paths starting with exactly 'target/release/'" >&2) | tail -n 1)
[ -f "$deb" ] || { echo "package.sh: cargo deb did not report a package (got: $deb)" >&2; exit 1; }
echo "$deb"
