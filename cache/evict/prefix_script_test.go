package evict

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// Policy scripts: a tiny text format for eviction behavior, one command a
// line, '#' starts a comment.
//
//	admit ID DEPTH [low]      Admit(Entry{ID, Depth, LowPriority: low})
//	touch ID                  Touch(ID)
//	remove ID                 Remove(ID)
//	cap N                     from now on, after each admit, evict (Victim +
//	                          Remove) until Len() <= N; 0 turns this off
//	evicted -> ID...          the ids evicted by cap since the last check
//	                          ("evicted -> none" for none); clears the list
//	victim -> ID|none         Victim(nil)
//	victim skip ID,... -> ID|none
//	drain -> ID...            Victim+Remove until empty, in order
//	len -> N                  Len()
//	admits ID-ID DEPTH        admit every id of the range, one chain each
//	                          (all at DEPTH), honoring cap
//
// runPolicyScripts runs every testdata/<dir>/*.txt against fresh policies
// from f, one subtest per file.
func runPolicyScripts(t *testing.T, dir string, f Factory) {
	files, err := filepath.Glob(filepath.Join("testdata", dir, "*.txt"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts in testdata/%s: %v", dir, err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) { runPolicyScript(t, file, f()) })
	}
}

func runPolicyScript(t *testing.T, file string, p Policy) {
	fh, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	capacity := 0
	var evicted []uint64
	admitOne := func(e Entry) {
		p.Admit(e)
		for capacity > 0 && p.Len() > capacity {
			id, ok := p.Victim(nil)
			if !ok {
				break
			}
			p.Remove(id)
			evicted = append(evicted, id)
		}
	}
	sc := bufio.NewScanner(fh)
	line := 0
	for sc.Scan() {
		line++
		text, _, _ := strings.Cut(sc.Text(), "#")
		cmd, want, hasWant := strings.Cut(text, "->")
		f := strings.Fields(cmd)
		if len(f) == 0 {
			continue
		}
		where := fmt.Sprintf("%s:%d: %s", file, line, strings.TrimSpace(sc.Text()))
		num := func(s string) uint64 {
			n, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				t.Fatalf("%s: bad number %q", where, s)
			}
			return n
		}
		wantIDs := func() string { return strings.Join(strings.Fields(want), " ") }
		gotIDs := func(ids []uint64) string {
			if len(ids) == 0 {
				return "none"
			}
			s := make([]string, len(ids))
			for i, id := range ids {
				s[i] = strconv.FormatUint(id, 10)
			}
			return strings.Join(s, " ")
		}
		if (f[0] == "victim" || f[0] == "drain" || f[0] == "len" || f[0] == "evicted") != hasWant {
			t.Fatalf("%s: '->' required exactly for victim, drain, len and evicted", where)
		}
		switch f[0] {
		case "admit":
			if len(f) < 3 || len(f) > 4 || (len(f) == 4 && f[3] != "low") {
				t.Fatalf("%s: want admit ID DEPTH [low]", where)
			}
			admitOne(Entry{ID: num(f[1]), Size: 1, Depth: int32(num(f[2])), LowPriority: len(f) == 4})
		case "admits":
			lo, hi, ok := strings.Cut(f[1], "-")
			if len(f) != 3 || !ok {
				t.Fatalf("%s: want admits LO-HI DEPTH", where)
			}
			for id := num(lo); id <= num(hi); id++ {
				admitOne(Entry{ID: id, Size: 1, Depth: int32(num(f[2]))})
			}
		case "touch":
			p.Touch(num(f[1]))
		case "remove":
			p.Remove(num(f[1]))
		case "cap":
			capacity = int(num(f[1]))
		case "evicted":
			if got := gotIDs(evicted); got != wantIDs() {
				t.Errorf("%s: evicted %s", where, got)
			}
			evicted = nil
		case "victim":
			var skip []uint64
			if len(f) == 3 && f[1] == "skip" {
				for _, s := range strings.Split(f[2], ",") {
					skip = append(skip, num(s))
				}
			} else if len(f) != 1 {
				t.Fatalf("%s: want victim [skip ID,...] -> ID|none", where)
			}
			id, ok := p.Victim(func(id uint64) bool { return slices.Contains(skip, id) })
			got := "none"
			if ok {
				got = strconv.FormatUint(id, 10)
			}
			if got != wantIDs() {
				t.Errorf("%s: got %s", where, got)
			}
		case "drain":
			var ids []uint64
			for {
				id, ok := p.Victim(nil)
				if !ok {
					break
				}
				p.Remove(id)
				ids = append(ids, id)
			}
			if got := gotIDs(ids); got != wantIDs() {
				t.Errorf("%s: got %s", where, got)
			}
		case "len":
			if got := strconv.Itoa(p.Len()); got != wantIDs() {
				t.Errorf("%s: got %s", where, got)
			}
		default:
			t.Fatalf("%s: unknown command %q", where, f[0])
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
}
