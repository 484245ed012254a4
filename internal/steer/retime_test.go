package steer

import (
	"errors"
	"testing"
	"time"
)

// TestParseMessage: what the sync and refused scripts publish, and what
// else may reach the channel (holds, slots, garbage), which is no retime.
func TestParseMessage(t *testing.T) {
	for _, tc := range []struct {
		payload string
		key     string
		at      int64
		cut, ok bool
	}{
		{"RULE|api.example.com:443\nretime 1764690000123456", "RULE|api.example.com:443", 1764690000123456, false, true},
		{"k\nrate 1764690000123456", "k", 1764690000123456, true, true},
		{"a\nb\nretime 5", "a", 0, false, false},             // a key holds no newline: the rest is not a retime
		{"k\n1764690000123456 1000000", "", 0, false, false}, // a hold
		{"k\nretime ", "", 0, false, false},
		{"k\nretime 99999999999999999999", "", 0, false, false},
		{"retime 5", "", 0, false, false},
		{"", "", 0, false, false},
	} {
		key, at, cut, ok := ParseMessage(tc.payload)
		if ok != tc.ok || ok && (key != tc.key || at != tc.at || cut != tc.cut) {
			t.Errorf("ParseMessage(%q) = %q, %d, %v, %v; want %q, %d, %v, %v", tc.payload, key, at, cut, ok, tc.key, tc.at, tc.cut, tc.ok)
		}
	}
}

// FuzzParseMessage: any payload parses or not, without a panic, and a
// retime parsed prints back as its payload.
func FuzzParseMessage(f *testing.F) {
	f.Add("k\nretime 5")
	f.Add("k\nrate -1")
	f.Add("k\n1 2")
	f.Fuzz(func(t *testing.T, payload string) {
		key, at, cut, ok := ParseMessage(payload)
		if !ok {
			return
		}
		kind := "retime "
		if cut {
			kind = "rate "
		}
		if back := key + "\n" + kind; len(payload) <= len(back) || payload[:len(back)] != back || at < 0 && payload[len(back)] != '-' {
			t.Errorf("%q parsed as key %q, at %d, cut %v", payload, key, at, cut)
		}
	})
}

// TestRetimesAfter: a booking before a retime of its key is voided, by a
// cut (ErrRecut) or a learned interval (ErrRetimed); one after, or of
// another key, is not; a retime wakes the sleepers' channel.
func TestRetimesAfter(t *testing.T) {
	var r Retimes
	now := time.Unix(1_700_000_000, 0)
	wake := r.Wake()
	r.Add("k", 100, false, now)
	select {
	case <-wake:
	default:
		t.Error("a retime did not close the channel of its sleepers")
	}
	r.Add("c", 100, true, now)
	for _, tc := range []struct {
		key    string
		booked int64
		want   error
	}{{"k", 99, ErrRetimed}, {"k", 100, nil}, {"c", 99, ErrRecut}, {"c", 100, nil}, {"other", 0, nil}} {
		if err := r.After(tc.key, tc.booked); !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
			t.Errorf("After(%q, %d) = %v, want %v", tc.key, tc.booked, err, tc.want)
		}
	}
	if !errors.Is(ErrRecut, ErrRetimed) {
		t.Error("ErrRecut is not an ErrRetimed")
	}
}
