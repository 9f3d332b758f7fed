#!/usr/bin/env bash
# Regenerates the Kitex/Thrift code in protocol/gen from idl/*.thrift.
# The generated code is committed; `scripts/gen-idl.sh --check` fails when
# regenerating would change it (CI runs the check).
set -euo pipefail
cd "$(dirname "$0")/.."
module=$(go list -m)
out=protocol/gen

# bound_lists DIR: Kitex's generated FastRead makes a list (or set, map)
# with the length read from the wire before reading any element, so a
# 50-byte message whose list header claims 2^31-1 items allocates gigabytes
# (and Kitex has no option to bound it). Every element takes at least one
# byte of the message, so a length above the bytes left is refused before
# the make; so is one above maxContainerLen (k-safe.go), because an element
# of one byte (an empty struct) still costs its Go size (64 bytes for a
# PutItem and its pointer), which would let a max_request_size message of
# STOP bytes allocate 64 times its size. Deterministic: the same input
# gives the same output.
bound_lists() {
	local f
	for f in $(find "$1" -name 'k-*.go' | sort); do
		awk '
			/^\t*(_, )+size, l, err := thrift\.Binary\.Read(List|Set|Map)Begin\(buf\[offset:\]\)$/ {
				match($0, /^\t*/)
				indent = substr($0, 1, RLENGTH)
				pending = 1
				print
				next
			}
			pending && $0 == indent "}" {
				print
				print indent "if size > len(buf)-offset || size > maxContainerLen {"
				print indent "\treturn offset, thrift.NewProtocolException(thrift.INVALID_DATA, \"container length exceeds the bytes left\")"
				print indent "}"
				pending = 0
				next
			}
			{ print }
		' "$f" >"$f.bound"
		mv "$f.bound" "$f"
	done
	# Fail loudly if Kitex's template changed and a container went unbounded.
	local begins bounds
	begins=$(grep -rhoE 'thrift\.Binary\.Read(List|Set|Map)Begin\(' "$1" | wc -l)
	bounds=$(grep -rhoF 'container length exceeds the bytes left' "$1" | wc -l)
	if [[ "$begins" != "$bounds" ]]; then
		echo "gen-idl: bounded $bounds of $begins container reads; update bound_lists" >&2
		exit 1
	fi
}

# safe_skip DIR (also writes k-safe.go, with bound_lists' maxContainerLen):
# gopkg's thrift.Binary.Skip indexes a 256-entry table with
# the field type read from the wire as a signed byte, so a type byte of
# 0x80 or more (in a field header, or as a list or map element type inside
# a skipped field) panics with an index out of range. Kitex recovers the
# panic on its read path, but a decoder must never panic: the generated
# code calls skipUnknown, which turns that panic into an INVALID_DATA
# protocol exception.
safe_skip() {
	local dir pkg
	for dir in $(find "$1" -name 'k-*.go' -not -name 'k-safe.go' -exec dirname {} \; | sort -u); do
		sed -i 's/thrift\.Binary\.Skip(/skipUnknown(/g' "$dir"/k-*.go
		pkg=$(sed -n 's/^package //p' "$dir"/k-consts.go)
		cat >"$dir/k-safe.go" <<-GO
			// Code added by scripts/gen-idl.sh (safe_skip). DO NOT EDIT.

			package $pkg

			import "github.com/cloudwego/gopkg/protocol/thrift"

			// maxContainerLen bounds the length of any list, set or map the
			// decoders accept (bound_lists): far above any batch the servers
			// allow (max_batch is at most this), low enough that a list of
			// empty structs costs at most 64 MiB.
			const maxContainerLen = 1 << 20

			// skipUnknown skips a field of type t like thrift.Binary.Skip, which
			// panics on a type byte of 0x80 or more; that is refused instead.
			func skipUnknown(b []byte, t thrift.TType) (n int, err error) {
				defer func() {
					if recover() != nil {
						n, err = 0, thrift.NewProtocolException(thrift.INVALID_DATA, "invalid field type")
					}
				}()
				return thrift.Binary.Skip(b, t)
			}
		GO
	done
}

# borrow_values DIR: the engine API's inline puts (PutRequest.value,
# PutItem.value) are decoded as slices of the request buffer instead of
# copies, which saves a copy of every put value (a MiB copy and its
# allocation, about a third of an inline put's CPU). Kitex releases that
# buffer right after decoding, before the handler runs, so the server's
# codec (protocol/safecodec) either keeps the request's bytes alive until
# the call has finished or calls OwnValues (written here, in k-borrow.go)
# to copy them before Kitex lets them go. No other decoder of these types
# may be used on a buffer that goes away.
borrow_values() {
	local f=$1/tidepool/k-tidepool.go n
	awk '
		/^func \(p \*(PutRequest\) FastReadField3|PutItem\) FastReadField2)\(buf \[\]byte\) \(int, error\) \{$/ { inside = 1 }
		inside && /thrift\.Binary\.ReadBinary\(buf\[offset:\]\)/ { sub(/thrift\.Binary\.ReadBinary\(/, "borrowBinary(") }
		inside && /^}$/ { inside = 0 }
		{ print }
	' "$f" >"$f.borrow"
	mv "$f.borrow" "$f"
	n=$(grep -c 'borrowBinary(buf\[offset:\])' "$f")
	if [[ "$n" != 2 ]]; then
		echo "gen-idl: borrowed $n of 2 put values; update borrow_values" >&2
		exit 1
	fi
	cat >"$1/tidepool/k-borrow.go" <<-GO
		// Code added by scripts/gen-idl.sh (borrow_values). DO NOT EDIT.

		package tidepool

		import (
			"bytes"
			"encoding/binary"

			"github.com/cloudwego/gopkg/protocol/thrift"
		)

		// borrowBinary reads a binary field as thrift.Binary.ReadBinary does,
		// but returns a slice of b instead of a copy (its capacity ends with
		// the field, so an append cannot write over the bytes after it).
		func borrowBinary(b []byte) (v []byte, l int, err error) {
			if len(b) < 4 {
				return nil, 0, thrift.NewProtocolException(thrift.INVALID_DATA, "binary length past the end of the message")
			}
			sz := int32(binary.BigEndian.Uint32(b))
			if sz < 0 {
				return nil, 0, thrift.NewProtocolException(thrift.NEGATIVE_SIZE, "negative binary length")
			}
			l = 4 + int(sz)
			if len(b) < l {
				return nil, 0, thrift.NewProtocolException(thrift.INVALID_DATA, "binary value past the end of the message")
			}
			return b[4:l:l], l, nil
		}

		// OwnValues replaces the borrowed put value with a copy of its own.
		func (p *TidepoolPutArgs) OwnValues() {
			if p.Req != nil {
				p.Req.Value = bytes.Clone(p.Req.Value)
			}
		}

		// OwnValues replaces the borrowed put values with copies of their own.
		func (p *TidepoolBatchPutArgs) OwnValues() {
			if p.Req == nil {
				return
			}
			for _, it := range p.Req.Items {
				if it != nil {
					it.Value = bytes.Clone(it.Value)
				}
			}
		}
	GO
}

# gen DEST: generate into a scratch folder first, so that a failed run
# leaves DEST as it was.
gen() {
	local dest=$1 work=protocol/.gen-work
	rm -rf "$work"
	mkdir -p "$work"
	for idl in idl/*.thrift; do
		if ! go tool kitex -module "$module" -gen-path "$work" -no-dependency-check "$idl" >/dev/null; then
			rm -rf "$work"
			echo "gen-idl: kitex failed on $idl" >&2
			exit 1
		fi
	done
	gofmt -w "$work"
	bound_lists "$work"
	safe_skip "$work"
	borrow_values "$work"
	gofmt -w "$work"
	grep -rl "$module/$work" "$work" | xargs -r sed -i "s#$module/$work#$module/$dest#g"
	rm -rf "$dest"
	mv "$work" "$dest"
}

if [[ "${1:-}" == "--check" ]]; then
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	# Kitex writes relative to the module root; generate into a scratch path
	# inside the module, then compare and remove it.
	scratch=protocol/.gen-check
	trap 'rm -rf "$tmp" "$scratch"' EXIT
	gen "$scratch"
	# Import paths inside the scratch copy name the scratch folder; rewrite
	# them so the trees are comparable.
	grep -rl "$module/$scratch" "$scratch" | xargs -r sed -i "s#$module/$scratch#$module/$out#g"
	if ! diff -r "$out" "$scratch" >"$tmp/diff"; then
		cat "$tmp/diff" | head -50
		echo "gen-idl: generated code in $out is stale; run scripts/gen-idl.sh" >&2
		exit 1
	fi
	echo "gen-idl: $out is up to date"
	exit 0
fi
gen "$out"
echo "gen-idl: wrote $out"
