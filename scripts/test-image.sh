#!/usr/bin/env bash
# Builds the image (scripts/build-image.sh), inspects it, runs it with crun
# and talks to the sidecar inside through its socket: the socket directory
# is a bind mount, and the host's `tidepool` client puts, reads back and
# lists a block through it; then SIGTERM, and the sidecar must exit 0.
#
# The container runs as the image's user (65532) with a read-only root,
# the arena directory on a tmpfs, its own network namespace and no cgroup
# limits. The build machines are themselves containers whose cgroups are
# in hybrid mode (v1 controllers, and hugetlb on the v2 hierarchy), which
# crun refuses ("cgroups in hybrid mode not supported, drop all
# controllers from cgroupv2"): crun runs with its cgroup manager disabled,
# in a private mount namespace with an empty tmpfs over /sys/fs/cgroup.
# Needs root, crun, umoci and skopeo (Debian).
#
#   scripts/test-image.sh          (make image)
set -euo pipefail
cd "$(dirname "$0")/.."

t0=$SECONDS
ref=$(scripts/build-image.sh)
layout=${ref%:*} tag=${ref##*:}
echo "test-image: built $ref in $((SECONDS - t0)) s"

echo "== umoci stat"
umoci stat --image "$ref"
echo "== skopeo inspect"
cfg=$(skopeo inspect --config "oci:$ref")
echo "$cfg"
# USER, ENTRYPOINT and CMD as the Dockerfile's last stage says them.
python3 - "$cfg" Dockerfile <<'PY'
import json, sys
c = json.loads(sys.argv[1])["config"]
key = {"USER": "User", "ENTRYPOINT": "Entrypoint", "CMD": "Cmd"}
want = {}
for line in open(sys.argv[2]):
    word, _, rest = line.strip().partition(" ")
    if word == "FROM":
        want = {}
    elif word == "USER":
        want["User"] = rest.strip()
    elif word in key:
        want[key[word]] = json.loads(rest)
if set(want) != {"User", "Entrypoint", "Cmd"}:
    sys.exit(f"test-image: the Dockerfile's last stage: USER, ENTRYPOINT, CMD not all found: {want}")
bad = {k: (c.get(k), v) for k, v in want.items() if c.get(k) != v}
if bad:
    sys.exit(f"test-image: image config differs from the Dockerfile's (got, want): {bad}")
print("test-image: USER, ENTRYPOINT and CMD are the Dockerfile's")
PY

work=$(mktemp -d /tmp/tidepool-image.XXXXXX)
name=tidepool-image-test-$$
crun() {
	unshare --mount --propagation private sh -c \
		'mount -t tmpfs no-cgroups /sys/fs/cgroup && exec crun --cgroup-manager=disabled "$@"' crun "$@"
}
cleanup() {
	crun delete --force "$name" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

umoci unpack --image "$ref" "$work/bundle" >/dev/null
echo "== tidepool version, inside"
sock=$work/sock
mkdir -m 0700 "$sock" "$work/data"
chown 65532:65532 "$sock" "$work/data"
# The bundle's config.json is umoci's runtime spec for the image; the
# sidecar's directories are mounts, as an injected pod's are volumes.
spec() {
	python3 - "$work/bundle/config.json" "$@" <<'PY'
import json, sys
path, args = sys.argv[1], sys.argv[2:]
c = json.load(open(path))
c["process"]["args"] = ["/usr/local/bin/tidepool"] + args
c["process"]["terminal"] = False
c["root"]["readonly"] = True
c["mounts"] += [
    {"destination": "/run/tidepool", "type": "bind", "source": path.rsplit("/bundle/", 1)[0] + "/sock", "options": ["rbind", "rw"]},
    {"destination": "/var/lib/tidepool", "type": "bind", "source": path.rsplit("/bundle/", 1)[0] + "/data", "options": ["rbind", "rw"]},
    {"destination": "/run/tidepool-arenas", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=0700", "uid=65532", "gid=65532", "size=96m"]},
]
json.dump(c, open(path, "w"), indent=1)
PY
}
spec version
inside=$(crun run --bundle "$work/bundle" "$name-v")
echo "$inside"
[[ $inside == *"${tag}"* ]] || { echo "test-image: version inside is not $tag" >&2; exit 1; }

echo "== tidepool serve, inside"
spec serve --socket=/run/tidepool/tidepool.sock --arena-dir=/run/tidepool-arenas \
	--data-dir=/var/lib/tidepool --dram-capacity=64MiB --ssd-capacity=64MiB
crun run --bundle "$work/bundle" "$name" >"$work/serve.log" 2>&1 &
runner=$!
for _ in $(seq 600); do
	[[ -S $sock/tidepool.sock ]] && break
	kill -0 "$runner" 2>/dev/null || { cat "$work/serve.log"; echo "test-image: the container exited" >&2; exit 1; }
	sleep 0.1
done
[[ -S $sock/tidepool.sock ]] || { cat "$work/serve.log"; echo "test-image: no socket after 60 s" >&2; exit 1; }
stat -c 'socket %n: owner %u:%g mode %a' "$sock/tidepool.sock"
[[ $(stat -c %u "$sock/tidepool.sock") == 65532 ]] || { echo "test-image: the sidecar did not run as 65532" >&2; exit 1; }

echo "== the host's client through the socket"
export TIDEPOOL_SOCKET=$sock/tidepool.sock
cp .cache/image/bin/usr/local/bin/tidepool "$work/tidepool" # the image's own binary
head -c 100000 /dev/urandom >"$work/block"
"$work/tidepool" put image-test-key "$work/block"
"$work/tidepool" get image-test-key -o "$work/back"
cmp "$work/block" "$work/back"
"$work/tidepool" stat

echo "== SIGTERM"
crun kill "$name" TERM
rc=0
wait "$runner" || rc=$?
tail -n 5 "$work/serve.log"
[[ $rc == 0 ]] || { echo "test-image: the sidecar exited $rc after SIGTERM" >&2; exit 1; }
echo "test-image: PASS in $((SECONDS - t0)) s"
