#!/usr/bin/env bash
# POSIX conformance through the mount: runs pjdfstest (the Rust port, from crates.io) against a
# Flotilla mount on this machine and prints "N passed, N failed". Needs root and /dev/fuse.
#
# Starts `flotilla local` (metadata service, two I/O servers and the mount, all on loopback
# ports they pick) in a temporary folder, runs every pjdfstest case in a fresh directory of
# the mount, and cleans up. Exits non-zero when a case fails that is not listed, with its
# reason, in scripts/pjdfstest-known-failures.txt (so the count of failures can only go down),
# or when a listed case now passes (so the list is kept true).
#
# pjdfstest counts test cases (each holds many assertions); its TODO-like cases that need a
# second file system or a read-only remount are skipped by its own configuration.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PJDFSTEST_VERSION=0.2.2
TOOLS=$ROOT/target/tools
KNOWN=$ROOT/scripts/pjdfstest-known-failures.txt

if [ "$(id -u)" != 0 ]; then
    echo "scripts/pjdfstest.sh: needs root (pjdfstest switches users and makes device nodes)" >&2
    exit 1
fi

# The runner, built once into target/tools and reused.
if [ ! -x "$TOOLS/bin/pjdfstest" ]; then
    cargo install --quiet --locked pjdfstest --version "$PJDFSTEST_VERSION" --root "$TOOLS"
fi
cargo build --quiet -p flotilla-cli
FLOTILLA=$ROOT/target/debug/flotilla

# pjdfstest switches to two unprivileged users: nobody and a user named "tests".
getent passwd tests >/dev/null || useradd -M -U -s /usr/sbin/nologin tests
nobody_group=$(id -gn nobody)

work=$(mktemp -d /tmp/flotilla-pjdfstest.XXXXXX)
# The users pjdfstest switches to must reach the mount.
chmod 0755 "$work"
local_pid=
cleanup() {
    if [ -n "$local_pid" ]; then
        kill "$local_pid" 2>/dev/null || true
        wait "$local_pid" 2>/dev/null || true
    fi
    if mountpoint -q "$work/mnt" 2>/dev/null; then
        "$FLOTILLA" umount --lazy "$work/mnt" >/dev/null 2>&1 || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

"$FLOTILLA" local --servers 2 --data "$work/data" --mount "$work/mnt" --listen 127.0.0.1:0 \
    >"$work/local.out" 2>"$work/local.err" &
local_pid=$!
for _ in $(seq 1 300); do
    grep -q '^mount=' "$work/local.out" 2>/dev/null && break
    kill -0 "$local_pid" 2>/dev/null || { cat "$work/local.err" >&2; exit 1; }
    sleep 0.1
done
grep -q '^mount=' "$work/local.out" || { echo "flotilla local did not mount" >&2; exit 1; }

cat >"$work/pjdfstest.toml" <<EOF
[features]
posix_fallocate = {}
utime_now = {}
utimensat = {}
rename_ctime = {}

[settings]
naptime = 0.01
allow_remount = false
expected_failures = []

[dummy_auth]
entries = [["nobody", "$nobody_group"], ["tests", "tests"]]
EOF

mkdir "$work/mnt/pjdfstest"
chmod 0755 "$work/mnt/pjdfstest"
set +e
(cd "$work/mnt/pjdfstest" && RUST_BACKTRACE=0 timeout 900 "$TOOLS/bin/pjdfstest" \
    -c "$work/pjdfstest.toml" -p "$work/mnt/pjdfstest" "$@") >"$work/pjdfstest.log" 2>&1
set -e
mkdir -p target
cp "$work/pjdfstest.log" target/pjdfstest.log

passed=$(grep -cE '[[:space:]]ok$' "$work/pjdfstest.log" || true)
grep -E '[[:space:]]FAILED$' "$work/pjdfstest.log" | awk '{print $1}' | sort -u >"$work/failed.txt" || true
failed=$(wc -l <"$work/failed.txt")
grep -E '^Summary:' "$work/pjdfstest.log" || { echo "pjdfstest did not finish; see target/pjdfstest.log" >&2; exit 1; }

# Known failures: one case name per line, then its reason after whitespace; # starts a comment.
sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$KNOWN" | awk '{print $1}' | sort -u >"$work/known.txt"
unexpected=$(comm -23 "$work/failed.txt" "$work/known.txt")
fixed=$(comm -13 "$work/failed.txt" "$work/known.txt")
status=0
if [ -n "$unexpected" ]; then
    echo "pjdfstest: failures not in scripts/pjdfstest-known-failures.txt:" >&2
    echo "$unexpected" | sed 's/^/  /' >&2
    status=1
fi
if [ -n "$fixed" ] && [ $# -eq 0 ]; then
    echo "pjdfstest: listed as known failures but passing now (remove them from the list):" >&2
    echo "$fixed" | sed 's/^/  /' >&2
    status=1
fi
echo "pjdfstest: $passed passed, $failed failed"
exit $status
