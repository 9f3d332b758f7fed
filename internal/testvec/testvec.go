// Package testvec reads the shared wire-format test vectors under
// protocol/testdata (bufsock.txt, putsock.txt): one vector per line,
// "KIND NAME [OP] HEX FIELD=VALUE..." (OP: at most three digits), '#'
// comments and blank lines skipped. The Go server's and the Go client's tests read them with this;
// the Python client's tests read the same files.
package testvec

import (
	"bufio"
	"encoding/hex"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// Vector is one line.
type Vector struct {
	Kind, Name string
	// Op is the op an answer answers (the word before the frame, when a
	// line has one: bufsock.txt's answers); -1 on other lines.
	Op int
	// Bytes is the frame.
	Bytes []byte
	// Fields maps a field to its value, except items; Items are the
	// item= values in order, each split at its commas.
	Fields map[string]string
	Items  [][]string
}

// Load reads protocol/testdata/name. It fails t on a line that does not
// parse, and when the file holds no vector.
func Load(t testing.TB, name string) []Vector {
	t.Helper()
	_, here, _, _ := runtime.Caller(0)
	path := filepath.Join(filepath.Dir(here), "..", "..", "protocol", "testdata", name)
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []Vector
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		w := strings.Fields(line)
		if len(w) < 3 {
			t.Fatalf("%s:%d: fewer than 3 words", name, n)
		}
		v := Vector{Kind: w[0], Name: w[1], Op: -1, Fields: map[string]string{}}
		rest := w[2:]
		if len(rest[0]) <= 3 { // an op (a frame is longer)
			if v.Op, err = strconv.Atoi(rest[0]); err != nil || len(rest) < 2 {
				t.Fatalf("%s:%d: want an op and a frame after the name", name, n)
			}
			rest = rest[1:]
		}
		if v.Bytes, err = hex.DecodeString(rest[0]); err != nil {
			t.Fatalf("%s:%d: %v", name, n, err)
		}
		for _, kv := range rest[1:] {
			k, val, ok := strings.Cut(kv, "=")
			if !ok {
				t.Fatalf("%s:%d: %q is not FIELD=VALUE", name, n, kv)
			}
			if k == "item" {
				v.Items = append(v.Items, strings.Split(val, ","))
				continue
			}
			v.Fields[k] = val
		}
		out = append(out, v)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatalf("%s: no vectors", name)
	}
	return out
}

// Uint parses a decimal field, failing t when it does not.
func Uint(t testing.TB, v Vector, s string) uint64 {
	t.Helper()
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatalf("%s: %v", v.Name, err)
	}
	return n
}

// Int parses a signed decimal field.
func Int(t testing.TB, v Vector, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatalf("%s: %v", v.Name, err)
	}
	return n
}

// Hex parses a hex field ("-" is empty).
func Hex(t testing.TB, v Vector, s string) []byte {
	t.Helper()
	if s == "-" {
		return []byte{}
	}
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatalf("%s: %v", v.Name, err)
	}
	return b
}
