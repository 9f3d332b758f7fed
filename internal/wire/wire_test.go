package wire

import "testing"

func TestReader(t *testing.T) {
	d := Reader{B: []byte{1, 0, 2, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 4, 0, 2, 'h', 'i'}}
	if d.U8() != 1 || d.U16() != 2 || d.U32() != 3 || d.U64() != 4 || string(d.Str16()) != "hi" || !d.Done() {
		t.Fatalf("fields misread: %+v", d)
	}
	for name, b := range map[string][]byte{
		"short u32":    {0, 0, 1},
		"str past end": {0, 5, 'a', 'b'},
	} {
		d := Reader{B: b}
		d.U32()
		if name == "str past end" {
			d = Reader{B: b}
			if d.Str16() != nil {
				t.Fatalf("%s: bytes returned", name)
			}
		}
		if d.Done() || !d.Bad {
			t.Fatalf("%s: not bad", name)
		}
		if d.U64() != 0 || d.Str16() != nil {
			t.Fatalf("%s: a field read after the end", name)
		}
	}
	if d := (Reader{B: []byte{9}}); d.U8() != 9 || !d.Done() {
		t.Fatal("one byte")
	}
	if d := (Reader{B: []byte{9, 9}}); d.U8() != 9 || d.Done() {
		t.Fatal("a byte left over counts as done")
	}
}
