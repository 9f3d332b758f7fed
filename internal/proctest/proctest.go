// Package proctest reads what tests need to know about a process's
// threads from /proc.
package proctest

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Thread is one thread of a process.
type Thread struct {
	TID  string // thread id
	Name string // its comm, as the thread set it (e.g. "rocksdb:high")
	Nice int
}

// Threads returns the threads of process pid ("self" for this one).
// Threads that end while it reads are left out.
func Threads(t testing.TB, pid string) []Thread {
	t.Helper()
	tasks, err := filepath.Glob(filepath.Join("/proc", pid, "task", "*"))
	if err != nil {
		t.Fatal(err)
	}
	var out []Thread
	for _, task := range tasks {
		comm, err := os.ReadFile(filepath.Join(task, "comm"))
		if err != nil {
			continue // the thread ended
		}
		stat, err := os.ReadFile(filepath.Join(task, "stat"))
		if err != nil {
			continue
		}
		// Fields after the parenthesised name: state is field 3, nice 19.
		f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		nice, err := strconv.Atoi(f[16])
		if err != nil {
			t.Fatalf("%s/stat: nice %q: %v", task, f[16], err)
		}
		out = append(out, Thread{TID: filepath.Base(task), Name: strings.TrimSpace(string(comm)), Nice: nice})
	}
	return out
}
