package steer

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestParseMessage: what the sync and refused scripts publish, and what
// else may reach the channel (holds, slots, garbage), which is no retime.
func TestParseMessage(t *testing.T) {
	for _, tc := range []struct {
		payload   string
		key       string
		at, after int64
		cut, ok   bool
	}{
		{"RULE|api.example.com:443\nretime 1764690000123456", "RULE|api.example.com:443", 1764690000123456, 0, false, true},
		{"k\nrate 1764690000123456", "k", 1764690000123456, 0, true, true},
		{"k\nrate 1764690000123456 1764690001123456", "k", 1764690000123456, 1764690001123456, true, true},
		{"k\nretime 1764690000123456 1764690001123456", "", 0, 0, false, false}, // a learned interval voids every booking before it
		{"k\nrate 1764690000123456 ", "", 0, 0, false, false},
		{"k\nrate 1764690000123456 x", "", 0, 0, false, false},
		{"a\nb\nretime 5", "a", 0, 0, false, false},             // a key holds no newline: the rest is not a retime
		{"k\n1764690000123456 1000000", "", 0, 0, false, false}, // a hold
		{"k\nretime ", "", 0, 0, false, false},
		{"k\nretime 99999999999999999999", "", 0, 0, false, false},
		{"retime 5", "", 0, 0, false, false},
		{"", "", 0, 0, false, false},
	} {
		key, at, after, cut, ok := ParseMessage(tc.payload)
		if ok != tc.ok || ok && (key != tc.key || at != tc.at || after != tc.after || cut != tc.cut) {
			t.Errorf("ParseMessage(%q) = %q, %d, %d, %v, %v; want %q, %d, %d, %v, %v", tc.payload, key, at, after, cut, ok, tc.key, tc.at, tc.after, tc.cut, tc.ok)
		}
	}
}

// FuzzParseMessage: any payload parses or not, without a panic, and a
// retime parsed prints back as its payload.
func FuzzParseMessage(f *testing.F) {
	f.Add("k\nretime 5")
	f.Add("k\nrate 5 7")
	f.Add("k\nrate -1")
	f.Add("k\n1 2")
	f.Fuzz(func(t *testing.T, payload string) {
		key, at, after, cut, ok := ParseMessage(payload)
		if !ok {
			return
		}
		kind := "retime "
		if cut {
			kind = "rate "
		}
		back := key + "\n" + kind
		if !strings.HasPrefix(payload, back) {
			t.Fatalf("%q parsed as key %q, at %d, cut %v", payload, key, at, cut)
		}
		atText, afterText, partial := strings.Cut(payload[len(back):], " ")
		n, err := strconv.ParseInt(atText, 10, 64)
		m, errAfter := strconv.ParseInt(afterText, 10, 64)
		if err != nil || n != at || partial && (!cut || errAfter != nil || m != after) || !partial && after != 0 {
			t.Errorf("%q parsed as key %q, at %d, after %d, cut %v", payload, key, at, after, cut)
		}
	})
}

// TestRetimesAfter: a booking before a retime of its key is voided, by a
// cut (ErrRecut) or a learned interval (ErrRetimed); one after, or of
// another key, is not, nor, after a smaller cut, one due before its AFTER,
// even once the cut is told again without it; a retime wakes the sleepers'
// channel.
func TestRetimesAfter(t *testing.T) {
	var r Retimes
	now := time.Unix(1_700_000_000, 0)
	wake := r.Wake()
	r.Add("k", 100, 0, false, now)
	select {
	case <-wake:
	default:
		t.Error("a retime did not close the channel of its sleepers")
	}
	r.Add("c", 100, 0, true, now)
	r.Add("q", 100, 1000, true, now) // a smaller cut: the bookings due after 1000
	r.Add("q", 100, 0, true, now)    // the same cut, told again for the processes that read no AFTER
	for _, tc := range []struct {
		key         string
		booked, due int64
		want        error
	}{{"k", 99, 99, ErrRetimed}, {"k", 100, 200, nil}, {"c", 99, 99, ErrRecut}, {"c", 100, 200, nil}, {"other", 0, 0, nil},
		{"q", 99, 1001, ErrRecut}, {"q", 99, 1000, nil}, {"q", 100, 2000, nil}} {
		if err := r.After(tc.key, tc.booked, tc.due); !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
			t.Errorf("After(%q, booked %d, due %d) = %v, want %v", tc.key, tc.booked, tc.due, err, tc.want)
		}
	}
	if !errors.Is(ErrRecut, ErrRetimed) {
		t.Error("ErrRecut is not an ErrRetimed")
	}
}
