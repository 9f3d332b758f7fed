package units

import "testing"

func TestParseBytes(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		bad  bool
	}{
		{"4096", 4096, false},
		{"512MiB", 512 << 20, false},
		{"4GiB", 4 << 30, false},
		{"4 gib", 4 << 30, false},
		{"1.5KiB", 1536, false},
		{"2GB", 2e9, false},
		{"64M", 64 << 20, false},
		{"10B", 10, false},
		{"", 0, true},
		{"-1MiB", 0, true},
		{"lots", 0, true},
		{"MiB", 0, true},
		{"1e30GiB", 0, true},
	} {
		got, err := ParseBytes(tc.in)
		if (err != nil) != tc.bad || got != tc.want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d, bad=%v", tc.in, got, err, tc.want, tc.bad)
		}
	}
}

func TestFormatBytes(t *testing.T) {
	for in, want := range map[int64]string{0: "0B", 1023: "1023B", 1536: "1.5KiB", 512 << 20: "512MiB", 4 << 30: "4GiB"} {
		if got := FormatBytes(in); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", in, got, want)
		}
	}
}

func TestParseCount(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		bad  bool
	}{
		{"3M", 3e6, false}, {"500k", 5e5, false}, {"1.5M", 1.5e6, false}, {"42", 42, false},
		{"x", 0, true}, {"-3M", 0, true},
	} {
		got, err := ParseCount(tc.in)
		if (err != nil) != tc.bad || got != tc.want {
			t.Errorf("ParseCount(%q) = %d, %v; want %d, bad=%v", tc.in, got, err, tc.want, tc.bad)
		}
	}
}
