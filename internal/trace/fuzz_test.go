package trace

import (
	"bytes"
	"encoding/json"
	"io"
	"testing"
)

// FuzzDecodeLine checks that DecodeLine never panics, that what it accepts
// re-encodes to an equal request, and that the streaming Reader agrees with
// DecodeLine on the same bytes fed in two arbitrary pieces. Seeds live in
// testdata/fuzz/FuzzDecodeLine.
func FuzzDecodeLine(f *testing.F) {
	f.Add([]byte(`{"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2]}`), uint(10))
	f.Fuzz(func(t *testing.T, line []byte, split uint) {
		req, err := DecodeLine(line)
		if err != nil {
			return
		}
		if req.Timestamp < 0 || req.InputLength < 0 || req.OutputLength < 0 || req.HashIDs == nil {
			t.Fatalf("accepted an invalid request %+v", req)
		}
		b, err := json.Marshal(map[string]any{
			"timestamp": req.Timestamp, "input_length": req.InputLength,
			"output_length": req.OutputLength, "hash_ids": req.HashIDs,
		})
		if err != nil {
			t.Fatal(err)
		}
		again, err := DecodeLine(b)
		if err != nil {
			t.Fatalf("re-encoded %s does not decode: %v", b, err)
		}
		if !equal(req, again) {
			t.Fatalf("round trip %+v -> %s -> %+v", req, b, again)
		}
		if bytes.ContainsAny(line, "\r\n") {
			return // the Reader splits lines; DecodeLine sees one
		}
		s := int(split % uint(len(line)+1))
		got, err := Read(&twoPieces{a: line[:s], b: line[s:]})
		if err != nil || len(got) != 1 || !equal(got[0], req) {
			t.Fatalf("Reader over %q split at %d = %+v, %v; DecodeLine = %+v", line, s, got, err, req)
		}
	})
}

func equal(a, b Request) bool {
	if a.Timestamp != b.Timestamp || a.InputLength != b.InputLength || a.OutputLength != b.OutputLength || len(a.HashIDs) != len(b.HashIDs) {
		return false
	}
	for i := range a.HashIDs {
		if a.HashIDs[i] != b.HashIDs[i] {
			return false
		}
	}
	return true
}

// twoPieces returns a, then b, then EOF: a reader that splits its input.
type twoPieces struct{ a, b []byte }

func (r *twoPieces) Read(p []byte) (int, error) {
	if len(r.a) > 0 {
		n := copy(p, r.a)
		r.a = r.a[n:]
		return n, nil
	}
	if len(r.b) > 0 {
		n := copy(p, r.b)
		r.b = r.b[n:]
		return n, nil
	}
	return 0, io.EOF
}
