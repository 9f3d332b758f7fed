package protocol

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"os"
	"strconv"
	"strings"
	"testing"
)

func parseTokens(t *testing.T, s string) []uint32 {
	t.Helper()
	if s == "-" {
		return nil
	}
	if n, ok := strings.CutPrefix(s, "r0-"); ok {
		c, err := strconv.Atoi(n)
		if err != nil {
			t.Fatal(err)
		}
		out := make([]uint32, c)
		for i := range out {
			out[i] = uint32(i)
		}
		return out
	}
	var out []uint32
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseUint(f, 10, 32)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, uint32(v))
	}
	return out
}

func parseHex(t *testing.T, s string) []byte {
	t.Helper()
	if s == "-" {
		return nil
	}
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestBlockKeyVectors checks BlockKey against vectors computed by an
// independent implementation (Python hashlib) in testdata/keys.txt.
func TestBlockKeyVectors(t *testing.T) {
	f, err := os.Open("testdata/keys.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	n := 0
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		fs := strings.Fields(line)
		if len(fs) != 5 {
			t.Fatalf("bad vector line %q", line)
		}
		got := BlockKey(parseHex(t, fs[1]), parseTokens(t, fs[2]), parseHex(t, fs[3]))
		if want := fs[4]; hex.EncodeToString(got[:]) != want {
			t.Errorf("%s: BlockKey = %x, want %s", fs[0], got, want)
		}
		n++
	}
	if n < 5 {
		t.Fatalf("only %d vectors read", n)
	}
}

func TestChainKeys(t *testing.T) {
	tokens := make([]uint32, 12+3) // three full blocks of 4 and a partial one
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	keys := ChainKeys(tokens, 4, nil)
	if len(keys) != 3 {
		t.Fatalf("got %d keys, want 3 (partial block has no key)", len(keys))
	}
	var parent []byte
	for i, k := range keys {
		want := BlockKey(parent, tokens[i*4:(i+1)*4], nil)
		if k != want {
			t.Fatalf("key %d differs from BlockKey chain", i)
		}
		parent = want[:]
	}
	// A different first block changes every later key.
	other := append([]uint32{99}, tokens[1:]...)
	ok := ChainKeys(other, 4, nil)
	for i := range keys {
		if ok[i] == keys[i] {
			t.Fatalf("key %d unchanged after the first block changed", i)
		}
	}
	if ChainKeys(tokens, 0, nil) != nil {
		t.Fatal("blockTokens 0 must give no keys")
	}
	// extra nil and empty are the same; a different extra is a different key.
	a, b, c := BlockKey(nil, tokens[:4], nil), BlockKey(nil, tokens[:4], []byte{}), BlockKey(nil, tokens[:4], []byte("x"))
	if a != b || a == c {
		t.Fatal("extra handling wrong")
	}
}

// FuzzBlockKey checks that BlockKey never panics, is deterministic, and that
// the encoding is unambiguous: moving a boundary between tokens and extra
// changes the key.
func FuzzBlockKey(f *testing.F) {
	f.Add([]byte{}, []byte{1, 0, 0, 0}, []byte("x"))
	f.Add(bytes.Repeat([]byte{7}, 32), []byte{1, 2, 3, 4, 5, 6, 7, 8}, []byte{})
	f.Fuzz(func(t *testing.T, parent, tokBytes, extra []byte) {
		if len(parent) != 0 && len(parent) != KeySize {
			parent = nil
		}
		toks := make([]uint32, len(tokBytes)/4)
		for i := range toks {
			toks[i] = uint32(tokBytes[4*i]) | uint32(tokBytes[4*i+1])<<8 | uint32(tokBytes[4*i+2])<<16 | uint32(tokBytes[4*i+3])<<24
		}
		k1 := BlockKey(parent, toks, extra)
		k2 := BlockKey(parent, toks, extra)
		if k1 != k2 {
			t.Fatal("not deterministic")
		}
		if len(toks) > 0 {
			// The last token moved into extra must give another key.
			last := tokBytes[4*(len(toks)-1) : 4*len(toks)]
			k3 := BlockKey(parent, toks[:len(toks)-1], append(append([]byte{}, last...), extra...))
			if k3 == k1 {
				t.Fatal("ambiguous encoding")
			}
		}
	})
}
