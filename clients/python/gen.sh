#!/usr/bin/env bash
# Regenerates the Thrift bindings of the Python client (tidepool/gen/) from
# idl/tidepool.thrift with Debian's thrift compiler (thrift-compiler).
#
#   clients/python/gen.sh           regenerate in place
#   clients/python/gen.sh --check   fail if the committed code is stale
#
set -euo pipefail
cd "$(dirname "$0")"
root=$(cd ../.. && pwd)
out=tidepool/gen
check=0
[[ "${1:-}" == --check ]] && check=1

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
thrift --gen py -out "$tmp" "$root/idl/tidepool.thrift"
mkdir -p "$tmp/final"
for f in __init__.py constants.py ttypes.py Tidepool.py; do
	cp "$tmp/tidepool/$f" "$tmp/final/$f"
done
if /usr/bin/python3 - "$tmp/final/ttypes.py" <<'PY'
import ast, sys
ast.parse(open(sys.argv[1]).read())
PY
then :; else
	echo "gen.sh: generated ttypes.py does not parse" >&2
	exit 1
fi

if ((check)); then
	if ! diff -r -q "$tmp/final" "$out" >/dev/null; then
		diff -r "$tmp/final" "$out" | head -40 >&2
		echo "gen.sh: clients/python/tidepool/gen is stale; run clients/python/gen.sh" >&2
		exit 1
	fi
	echo "gen.sh: python bindings up to date"
	exit 0
fi
rm -rf "$out"
mkdir -p "$out"
cp "$tmp/final/"*.py "$out/"
echo "gen.sh: wrote $out"
